"""Measured data the simulator reads (``overheads.json``: benchmarks/sim_overheads.py)."""
