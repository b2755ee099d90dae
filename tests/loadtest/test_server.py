"""What loadtest.server reads from /metrics (its /proc readings: tests/loadtest/test_procs.py)."""

from __future__ import annotations

from loadtest.server import parse_exposition


def test_exposition_parses_to_series_by_name_and_labels() -> None:
    text = (
        "# HELP zhembed_batch_size Inputs per batch.\n"
        "# TYPE zhembed_batch_size histogram\n"
        'zhembed_batch_size_bucket{le="8.0"} 3.0\n'
        "zhembed_batch_size_sum 17.0\n"
        "zhembed_batch_size_count 3.0\n"
        'zhembed_cache_hits_total{tier="memory"} 2.5e+03\n'
    )
    series = parse_exposition(text)
    assert series == {
        'zhembed_batch_size_bucket{le="8.0"}': 3.0,
        "zhembed_batch_size_sum": 17.0,
        "zhembed_batch_size_count": 3.0,
        'zhembed_cache_hits_total{tier="memory"}': 2500.0,
    }
