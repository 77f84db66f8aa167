"""pycocoevalcap's ``cider`` package: see :mod:`finecap.compat.pycocoevalcap`."""
