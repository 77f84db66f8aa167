"""finecap.report."""
