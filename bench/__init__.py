"""Benchmarks: queickd against the original Queick 1.2.1. Run `python -m bench.run --help`."""
