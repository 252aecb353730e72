"""Benchmarks: `python -m bench.run` (all) or `python -m bench.<name>`; JSON in bench/results."""
