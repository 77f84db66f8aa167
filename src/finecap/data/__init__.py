"""finecap.data."""
