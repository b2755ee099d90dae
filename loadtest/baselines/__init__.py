"""Baseline services the benchmark compares ours with."""
