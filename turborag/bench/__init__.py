"""Benchmarks that measure modes side by side in one run, and the demo."""
