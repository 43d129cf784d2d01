"""Trainwright benchmarks: `python benchmarks/run.py` (see docs/benchmarks.md). Not part of the test suite."""
