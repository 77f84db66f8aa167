"""pycocoevalcap's ``meteor`` package: see :mod:`finecap.compat.pycocoevalcap`."""
