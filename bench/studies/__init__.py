"""One-off studies outside `python3 -m bench`'s list; each prints its JSON (docs/performance.md has findings)."""
