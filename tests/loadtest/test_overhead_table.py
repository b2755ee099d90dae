"""loadtest.overhead_table: the CPU split a cell derives, and issue 19's targets drawn from it."""

from __future__ import annotations

from loadtest.overhead import parse_cells
from loadtest.overhead_table import Cell, targets


def test_gpu_like_targets_are_the_machinery_at_64_and_256_clients() -> None:
    def made(label: str, outside: float, floor_us: float) -> Cell:
        clients, texts = parse_cells(label)[0]
        # 1e4 sentences computed, 100 us of Session.run each, `outside` us of the rest.
        c = Cell(clients, texts, 1000.0, 1000.0 / texts, 1.0, 2.0, 0, 10, None, {}, 8.0, 1e4,
                 1e-2 * (100 + outside), 1.0, 10.0, 0.1, "")  # fmt: skip
        c.tokenize_us, c.write_us = floor_us, 0.0
        return c

    lines = targets([made("64x32", 30.0, 10.0), made("256x32", 50.0, 10.0)], gpu_like=True)
    assert "  [PASS] machinery <= 25 us/sentence at 64x32 (--gpu-like): 20 us" in lines, lines
    assert "  [MISS] machinery <= 25 us/sentence at 256x32 (--gpu-like): 40 us" in lines, lines
    assert any(
        line.startswith("  [n/a ] machinery <= 60 us/sentence at 8x32 (CPU defaults)") for line in lines
    )
