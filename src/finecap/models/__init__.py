"""finecap.models."""
