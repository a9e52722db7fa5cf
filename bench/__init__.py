"""Benchmarks: each module runs peers side by side and prints a table for BENCHMARKS.md."""
