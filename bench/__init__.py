"""Benchmark drivers, one per benchmark (`python3 -m bench.<name>` prints its JSON; `python3 -m bench` files it)."""
