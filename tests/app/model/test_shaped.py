"""Batches on the grid of shapes, on the CPU provider with the tiny export: padding never reaches an answer,
IOBinding gives what the plain run gives, the warm-up runs each shape once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.model.grid import warm_shapes
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings


def _model(folder: Path, **changes: Any) -> OnnxModel:
    return load_model(Settings(model=str(folder), variant="fp32", intra_op_threads=1, **changes))


@pytest.fixture(scope="module")
def exact(tiny_model_dir: Path) -> OnnxModel:
    return _model(tiny_model_dir)


@pytest.fixture(scope="module")
def gridded(tiny_model_dir: Path) -> OnnxModel:
    return _model(tiny_model_dir, shape_grid="on", max_batch_size=8, max_batch_tokens=256)


def _batch(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    longest = max(lengths)
    mask = (np.arange(longest)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    ids = np.zeros(mask.shape, np.int64)
    ids[mask.astype(bool)] = np.random.default_rng(seed).integers(700, 5000, int(mask.sum()))
    ids[:, 0] = 101
    return ids, mask


def test_the_cpu_keeps_exact_shapes_unless_asked(exact: OnnxModel, gridded: OnnxModel) -> None:
    assert exact.shapes is None  # shape_grid auto on the CPU provider
    assert gridded.shapes is not None and gridded.shapes.grid.max_rows == 8


@pytest.mark.parametrize("lengths", [[5, 9, 3], [17], [2, 2, 2, 2, 2], [30, 1, 16, 7, 12, 3, 8]])
def test_padding_rows_and_columns_never_reach_an_answer(
    exact: OnnxModel, gridded: OnnxModel, lengths: list[int]
) -> None:
    ids, mask = _batch(lengths)
    layer = exact.num_layers
    names = [f"mean_{layer}", f"cls_{layer}", exact.output_name(layer), "pooler_output"]
    for plain, padded, name in zip(
        exact.encode(ids, mask, names), gridded.encode(ids, mask, names), names, strict=True
    ):
        assert padded.shape == plain.shape, name  # cut back to the batch's own rows and tokens
        # The token states only where the mask is on: past a sequence's end the plain run's are not read.
        where = mask.astype(bool) if padded.ndim == 3 else slice(None)
        np.testing.assert_allclose(padded[where], plain[where], rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_pooled_only_batch_runs_bound_and_equals_the_plain_run(
    exact: OnnxModel, gridded: OnnxModel
) -> None:
    runner = gridded.shapes.runner if gridded.shapes is not None else None
    assert runner is not None
    ids, mask = _batch([11, 4, 7])
    name = f"mean_{exact.num_layers}"
    before = runner.runs
    (bound,) = gridded.encode(ids, mask, [name])
    assert runner.runs == before + 1  # through IOBinding, not the session's plain run
    np.testing.assert_allclose(bound, exact.encode(ids, mask, [name])[0], rtol=1e-5, atol=1e-5)
    # The shape's output buffer is reused: a second batch of the same grid shape writes into it.
    again, _ = _batch([12, 6, 2], seed=1)
    (second,) = gridded.encode(again, (again > 0).astype(np.int64), [name])
    assert second.base is bound.base and second.shape == (3, exact.hidden_size)


def test_token_type_ids_reach_the_padded_batch(exact: OnnxModel, gridded: OnnxModel) -> None:
    ids, mask = _batch([9, 6])
    types = np.zeros_like(ids)
    types[:, 4:] = 1
    types *= mask
    name = f"mean_{exact.num_layers}"
    plain = exact.encode(ids, mask, [name], types)[0]
    np.testing.assert_allclose(gridded.encode(ids, mask, [name], types)[0], plain, rtol=1e-5, atol=1e-5)
    assert not np.allclose(plain, exact.encode(ids, mask, [name])[0], atol=1e-4)  # the types mattered


def test_io_binding_off_runs_plain_on_the_grid(tiny_model_dir: Path, exact: OnnxModel) -> None:
    model = _model(tiny_model_dir, shape_grid="on", io_binding=False, max_batch_size=4)
    assert model.shapes is not None and model.shapes.runner is None
    ids, mask = _batch([7, 3])
    name = f"cls_{exact.num_layers}"
    np.testing.assert_allclose(
        model.encode(ids, mask, [name])[0], exact.encode(ids, mask, [name])[0], rtol=1e-5, atol=1e-5
    )


def test_the_warm_up_runs_each_grid_shape_the_limits_allow_once(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir, shape_grid="on", max_batch_size=8, max_batch_tokens=256)
    shapes = model.shapes
    assert shapes is not None
    seen: list[tuple[int, int]] = []
    encode = shapes.encode

    def counted(ids: np.ndarray, mask: np.ndarray, outputs: list[str], types: Any = None) -> Any:
        seen.append(shapes.grid.shape(*ids.shape))
        return encode(ids, mask, outputs, types)

    shapes.encode = counted  # type: ignore[method-assign,assignment]

    def room(length: int) -> int:
        return max(1, min(8, 256 // length))

    ticks = iter([10.0, 12.5])
    warmed = shapes.warm(room, clock=lambda: next(ticks))
    expected = warm_shapes(shapes.grid, room)
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))  # each once
    assert warmed.shapes == len(expected) and warmed.runs == len(expected) and warmed.graphs == 0
    assert warmed.seconds == 2.5
    most = {length: max(r for r, n in seen if n == length) for _, length in seen}
    # 256 tokens: 17..32 tokens fit 15 a batch (8 rows), 33..48 fit 7 (padded to 8), 65..80 fit 3 (to 4).
    assert most[16] == most[32] == most[48] == 8 and most[80] == 4
    info = shapes.describe()
    assert info["warmed_shapes"] == len(expected) and info["warmup_s"] == 2.5
    assert (
        info["shapes"] == shapes.grid.size() and info["cuda_graphs"] is False and info["io_binding"] is True
    )
