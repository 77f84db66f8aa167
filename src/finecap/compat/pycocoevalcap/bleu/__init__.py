"""pycocoevalcap's ``bleu`` package: see :mod:`finecap.compat.pycocoevalcap`."""
