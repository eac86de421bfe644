"""Replaying a trace through a cache design: the driver (driver.py), its options, results
and metrics, and several designs side by side (simulate.py)."""
