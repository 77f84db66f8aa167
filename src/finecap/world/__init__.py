"""finecap.world."""
