"""Only the command spelling `python -m benchmarks.profile_summary` (the benchmark code is
efficientdet_hpu.benchmarks, its commands `python bench.py ...`)."""
