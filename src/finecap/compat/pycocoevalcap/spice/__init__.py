"""pycocoevalcap's ``spice`` package: see :mod:`finecap.compat.pycocoevalcap`."""
