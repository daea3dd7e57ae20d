"""Runners of the experiments in docs/BENCHMARKS.md, each `python -m turborag_research.experiments.NAME`."""
