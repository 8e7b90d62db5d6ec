"""Benchmarks: `overlapcheck bench` and `python -m overlapcheck.bench.<name>`. They print numbers;
no test times anything."""
