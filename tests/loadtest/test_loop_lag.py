"""loadtest.loop_lag's reading of the lag histogram and its table."""

from __future__ import annotations

from loadtest.loop_lag import ROUTES, Cell, lag_samples_over, masked, table

EXPOSITION = """# HELP zhembed_event_loop_lag_seconds lag
zhembed_event_loop_lag_seconds_bucket{le="0.02"} 90.0
zhembed_event_loop_lag_seconds_bucket{le="0.05"} 97.0
zhembed_event_loop_lag_seconds_bucket{le="0.1"} 99.0
zhembed_event_loop_lag_seconds_bucket{le="+Inf"} 100.0
zhembed_event_loop_lag_seconds_count 100.0
"""


def test_samples_over_the_bound_are_those_past_its_bucket() -> None:
    assert lag_samples_over(EXPOSITION, 0.05) == 3.0
    assert lag_samples_over(EXPOSITION, 0.02) == 10.0


def test_a_service_without_the_metric_reads_none() -> None:
    assert lag_samples_over("zhembed_requests_total 1.0\n") is None


def test_the_table_has_a_row_per_cell() -> None:
    cells = [Cell("/fill-mask", "128 masks", [1.0, 2.0, 90.0], {200: 3}, None)]
    lines = table(cells).splitlines()
    assert lines[2] == "| /fill-mask | 128 masks | 3 | 2.0 | 90.0 | 90.0 | 3× 200 | — |"


def test_each_row_is_within_the_limits_of_a_full_size_model() -> None:
    assert masked(512).count("[MASK]") == 128 and masked(128).count("[MASK]") == 118
    assert len({heavy.route for heavy in ROUTES}) == len(ROUTES)
