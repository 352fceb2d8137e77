"""What `python3 -m bench` makes from the results JSON: SUMMARY.md / docs/results.md (summary) and the plots."""
