"""Benchmarks (scripts, not tests): throughput, compile time, memory, data pipeline."""
