"""The grid of batch shapes: bounds, monotone, a bounded count, and padding rows that pool to something."""

from __future__ import annotations

import numpy as np

from app.model.grid import COARSE_STEP, FINE_STEP, FINE_UNTIL, ShapeGrid, fill, wanted, warm_shapes


def test_lengths_round_up_by_16_to_128_then_by_32_up_to_the_longest_input() -> None:
    grid = ShapeGrid(max_rows=256, max_length=512)
    assert [grid.length(n) for n in (1, 16, 17, 100, 128, 129, 160, 161, 500, 512)] == [
        16, 16, 32, 112, 128, 160, 160, 192, 512, 512,
    ]  # fmt: skip
    assert grid.lengths() == list(range(16, 129, FINE_STEP)) + list(range(160, 513, COARSE_STEP))
    assert ShapeGrid(8, 40).lengths() == [16, 32, 40]  # never past the model's longest input


def test_rows_round_up_to_a_power_of_two_up_to_max_batch_size() -> None:
    grid = ShapeGrid(max_rows=100, max_length=512)
    assert [grid.rows(n) for n in (1, 2, 3, 5, 64, 65, 100)] == [1, 2, 4, 8, 64, 100, 100]
    assert grid.row_counts() == [1, 2, 4, 8, 16, 32, 64, 100]


def test_the_grid_is_monotone_covering_and_bounded() -> None:
    grid = ShapeGrid(max_rows=256, max_length=512)
    n = np.arange(1, 513)
    lengths = grid.lengths_of(n)
    assert (np.diff(lengths) >= 0).all() and (lengths >= n).all() and lengths.max() == 512
    assert (lengths - n < np.where(n <= FINE_UNTIL, FINE_STEP, COARSE_STEP)).all()  # padding under a step
    rows = grid.rows_of(np.arange(1, 257))
    assert (
        (np.diff(rows) >= 0).all()
        and (rows >= np.arange(1, 257)).all()
        and (rows < 2 * np.arange(1, 257)).all()
    )
    assert grid.size() == 20 * 9  # at most 20 lengths × 9 row counts, whatever the traffic


def test_auto_puts_cuda_on_the_grid_and_keeps_the_cpu_exact() -> None:
    assert wanted("auto", "CUDAExecutionProvider") and not wanted("auto", "CPUExecutionProvider")
    assert wanted("on", "CPUExecutionProvider") and not wanted("off", "CUDAExecutionProvider")


def test_warm_shapes_are_those_the_limits_allow_padded() -> None:
    grid = ShapeGrid(max_rows=8, max_length=128)

    def room(length: int) -> int:  # 128 tokens a batch
        return max(1, min(8, 128 // length))

    shapes = warm_shapes(grid, room)
    assert len(shapes) == len(set(shapes))
    assert (8, 16) in shapes and (8, 32) in shapes  # 17 tokens: 7 fit, padded to 8 rows at 32
    assert (4, 48) in shapes and (8, 48) not in shapes  # 33 tokens: 3 fit, padded to 4
    assert (1, 128) in shapes and (2, 128) not in shapes  # 113 tokens: 1 fits
    costs = [rows * length for rows, length in shapes]
    assert costs == sorted(costs)  # cheapest first


def test_fill_pads_columns_with_a_zero_mask_and_rows_with_cls_sep() -> None:
    ids = np.array([[101, 7, 102, 0], [101, 8, 9, 102]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]])
    into = (np.full((4, 16), -1), np.full((4, 16), -1), np.full((4, 16), -1))
    fill(into, ids, mask, None, (101, 102, 0))
    out_ids, out_mask, out_types = into
    np.testing.assert_array_equal(out_ids[:2, :4], ids)
    assert (out_ids[:2, 4:] == 0).all() and (out_mask[:2, 4:] == 0).all()
    np.testing.assert_array_equal(out_mask[:2, :4], mask)
    assert (out_ids[2:, :2] == [101, 102]).all() and (out_mask[2:].sum(axis=1) == 2).all()
    assert (out_types == 0).all()  # every place written: no -1 left from before
    fill(into, ids[:1, :3], mask[:1, :3], np.array([[0, 1, 1]]), (101, 102, 0))
    assert out_types[0, :3].tolist() == [0, 1, 1] and (out_types[1:] == 0).all() and out_ids[1, 1] == 102


def test_one_batch_s_shape_is_the_arrays_arithmetic_on_one_int() -> None:
    grid = ShapeGrid(max_rows=48, max_length=300)  # neither a power of two nor a step's multiple
    lengths, rows = np.arange(0, 320), np.arange(0, 60)
    assert [grid.length(int(n)) for n in lengths] == grid.lengths_of(lengths).tolist()
    assert [grid.rows(int(n)) for n in rows] == grid.rows_of(rows).tolist()
