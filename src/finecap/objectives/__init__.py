"""finecap.objectives."""
