"""``ts.utils``: helpers handlers import."""
