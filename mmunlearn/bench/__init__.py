"""Benchmark scripts (print a table, optionally write JSON): ``python -m mmunlearn.bench ...``."""
