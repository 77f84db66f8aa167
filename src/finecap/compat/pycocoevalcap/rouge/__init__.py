"""pycocoevalcap's ``rouge`` package: see :mod:`finecap.compat.pycocoevalcap`."""
