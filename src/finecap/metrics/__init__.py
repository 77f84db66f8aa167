"""finecap.metrics."""
