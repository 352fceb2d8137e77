"""Benchmark drivers (run from the repo root: python3 -m bench.<name>)."""
