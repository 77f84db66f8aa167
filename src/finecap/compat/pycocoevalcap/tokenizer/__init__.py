"""pycocoevalcap's ``tokenizer`` package: see :mod:`finecap.compat.pycocoevalcap`."""
