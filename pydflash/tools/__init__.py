"""Offline tools: weight comparison, benchmarks."""
