"""Benchmarks and profiling behind `bench.py`: the training benchmark, inference latency,
the input pipeline alone, the suite that writes docs/benchmarks-*.md, report tables, and the
profiler-trace summary (`python -m benchmarks.profile_summary` at the checkout root)."""
