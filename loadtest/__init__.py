"""Benchmarks and load tests. Scripts here print tables; speed targets live here, never in tests."""
