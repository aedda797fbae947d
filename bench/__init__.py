"""Benchmarks: `python -m bench` runs them all, `python -m bench engine` one of them; `--quick` for a short run."""
