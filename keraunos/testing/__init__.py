"""Deterministic test data shared by keraunos's tests and benchmarks (no test framework imports)."""
