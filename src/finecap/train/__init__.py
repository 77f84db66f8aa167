"""finecap.train."""
