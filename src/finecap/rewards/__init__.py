"""finecap.rewards."""
