"""loadtest.gpu_check_table: issue 13's targets drawn from the main cells, and a cell that failed."""

from __future__ import annotations

from loadtest.gpu_check_table import Cell, format_cell, targets


def _cell(
    label: str, sentences_per_s: float, p50_ms: float, p99_ms: float, client_cores: float = 0.3
) -> Cell:
    clients, texts = (int(x) for x in label.split()[0].split("x"))
    return Cell(label, clients, texts, "float", 4, 4.0, sentences_per_s, sentences_per_s / texts, p50_ms,
                p99_ms, 0, 100, None, {"200": 100}, 64.0, 0.5, 3.0, client_cores, 10.0, "")  # fmt: skip


def test_each_target_is_judged_on_its_own_cell_and_a_missing_cell_is_not_measured() -> None:
    main = {
        "256x32": _cell("256x32", 25_000.0, 300.0, 2500.0),
        "1x1": _cell("1x1", 400.0, 2.5, 12.0, client_cores=0.95),
    }
    lines = targets(main, 256, ceiling=60_000.0)
    assert "  [PASS] 256x32 >= 20,000 sentences/s: 25,000" in lines
    assert "  [MISS] 256x32 >= 0.5 x raw ceiling: 0.42 (25,000 / 60,000)" in lines
    assert "  [MISS] 256x32 p99 <= 2000 ms: 2500 ms" in lines
    assert "  [n/a ] 256x1 >= 5,000 requests/s: not measured" in lines
    assert "  [PASS] 1x1 p50 <= 4 ms: 2.50 ms (client at 0.95 cores: it may be the limit)" in lines
    assert "  [MISS] 1x1 p99 <= 10 ms: 12.00 ms (client at 0.95 cores: it may be the limit)" in lines


def test_a_cell_on_fewer_workers_than_asked_fails_and_says_so() -> None:
    c = _cell("256x32", 25_000.0, 300.0, 900.0)
    assert not c.failed
    c.workers_ready = 3.0
    assert c.failed and "zhembed_workers_ready 3" in format_cell(c)
