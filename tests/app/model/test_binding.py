"""The graph cache's bookkeeping and the bound runner's calls, with a fake session: the CPU cannot capture
CUDA graphs, so what is tested here is which run says which ``gpu_graph_id`` and what is called."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.model.binding import CAPTURE_RUNS, GRAPH_ID, NO_GRAPH, BoundRunner, GraphCache, _Bound
from app.model.grid import ShapeGrid
from app.model.shaped import GridEncoder, GridPlan, plan, providers
from app.settings import Settings

CUDA = "CUDAExecutionProvider"


@dataclass
class Meta:
    name: str
    shape: list[Any]
    type: str = "tensor(float)"


@dataclass
class FakeBinding:
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)

    def bind_ortvalue_input(self, name: str, value: Any) -> None:
        self.inputs[name] = value

    def bind_ortvalue_output(self, name: str, value: Any) -> None:
        self.outputs[name] = value


@dataclass
class FakeSession:
    """Records each run's ``gpu_graph_id``; writes each row's mask sum into the bound pooled output."""

    graph_ids: list[int] = field(default_factory=list)
    plain: list[Any] = field(default_factory=list)

    def get_outputs(self) -> list[Meta]:
        return [Meta("mean_2", ["batch", 4]), Meta("last_hidden_state", ["batch", "sequence", 4])]

    def io_binding(self) -> FakeBinding:
        return FakeBinding()

    def run_with_iobinding(self, binding: FakeBinding, run_options: Any = None) -> None:
        entry = run_options.get_run_config_entry(GRAPH_ID) if run_options is not None else ""
        self.graph_ids.append(int(entry) if entry else 0)
        mask = binding.inputs["attention_mask"].numpy()
        out = binding.outputs["mean_2"].numpy()  # a CPU OrtValue: the host array's own memory
        out[:] = mask.sum(axis=1, keepdims=True)

    def run(self, outputs: list[str], feed: dict[str, np.ndarray], run_options: Any = None) -> list[Any]:
        self.plain.append(run_options)
        mask = feed["attention_mask"]
        return [np.repeat(mask[:, :, None], 4, axis=2).astype(np.float32)]


def _key(rows: int, length: int) -> Any:
    return ((rows, length), ("mean_2",))


def test_a_small_shape_is_captured_once_and_replayed_after() -> None:
    graphs = GraphCache(enabled=True, max_rows=4)
    ids = [graphs.graph_id(_key(2, 16), warming=True) for _ in range(CAPTURE_RUNS)]
    for _ in ids:
        graphs.ran(_key(2, 16))
    assert ids == [1] * CAPTURE_RUNS and graphs.captured(_key(2, 16)) and graphs.count == 1
    assert graphs.replays == 0
    assert graphs.graph_id(_key(2, 16), warming=False) == 1  # served later: the same graph, replayed
    graphs.ran(_key(2, 16))
    assert graphs.replays == 1 and graphs.count == 1
    assert graphs.graph_id(_key(4, 32), warming=True) == 2  # ids from 1: ONNX Runtime's 0 is "none said"


def test_large_shapes_and_shapes_first_seen_serving_are_never_captured() -> None:
    graphs = GraphCache(enabled=True, max_rows=4)
    assert graphs.graph_id(_key(8, 16), warming=True) == NO_GRAPH
    assert graphs.graph_id(_key(1, 16), warming=False) == NO_GRAPH  # a capture would cost the batch runs
    assert graphs.count == 0 and not graphs.ids


def test_graphs_off_is_no_capture() -> None:
    graphs = GraphCache(enabled=False, max_rows=64)
    assert graphs.graph_id(_key(1, 16), warming=True) == NO_GRAPH and graphs.count == 0


def test_the_runner_passes_graph_ids_and_cuts_padding_rows() -> None:
    session = FakeSession()
    runner = BoundRunner(session, {"mean_2": (4, np.float32)}, (101, 102, 0), "cpu", GraphCache(True, 2))
    ids = np.array([[101, 5, 102]])
    mask = np.ones_like(ids)
    runner.warming = True
    for _ in range(CAPTURE_RUNS):
        (out,) = runner.run((2, 16), ids, mask, None, ["mean_2"])
    runner.warming = False
    runner.run((2, 16), ids, mask, None, ["mean_2"])
    runner.run((4, 16), np.repeat(ids, 3, axis=0), np.repeat(mask, 3, axis=0), None, ["mean_2"])
    assert session.graph_ids == [1, 1, 1, 1, NO_GRAPH]  # captured, replayed; 4 rows: never a graph
    assert out.shape == (1, 4) and (out == 3).all()  # the padding row (mask of 2) is cut off
    assert runner.graphs.count == 1 and runner.graphs.replays == 1 and runner.shapes() == 2


def test_without_graphs_a_bound_run_takes_no_run_options() -> None:
    session = FakeSession()
    runner = BoundRunner(session, {"mean_2": (4, np.float32)}, (101, 102, 0))
    runner.run((1, 16), np.array([[101, 102]]), np.array([[1, 1]]), None, ["mean_2"])
    assert session.graph_ids == [0] and runner.graphs.count == 0


def test_plain_runs_beside_graphs_say_no_graph_and_are_cut_back() -> None:
    session = FakeSession()
    skip = object()
    encoder = GridEncoder(
        session,
        ShapeGrid(4, 64),
        (101, 102, 0),
        ["mean_2"],
        ["mean_2"],
        graphs=GraphCache(True, 4),
        plain_options=skip,
    )
    (states,) = encoder.encode(np.array([[101, 7, 102]]), np.ones((1, 3), np.int64), ["last_hidden_state"])
    assert states.shape == (1, 3, 4) and session.plain == [skip]


def test_settings_turn_the_grid_binding_and_graphs_on_and_off() -> None:
    on = plan(Settings(), CUDA, 512)
    assert on is not None and on.cuda_graphs and on.io_binding and on.device == "cuda"
    assert on.grid == ShapeGrid(Settings().max_batch_size, 512) and on.graph_max_rows == 16
    assert plan(Settings(), "CPUExecutionProvider", 512) is None
    cpu = plan(Settings(shape_grid="on"), "CPUExecutionProvider", 512)
    assert cpu is not None and not cpu.cuda_graphs and cpu.device == "cpu"  # the CPU cannot capture
    assert not plan(Settings(cuda_graphs=False), CUDA, 512).cuda_graphs  # type: ignore[union-attr]
    assert not plan(Settings(io_binding=False), CUDA, 512).cuda_graphs  # type: ignore[union-attr]
    assert plan(Settings(shape_grid="off"), CUDA, 512) is None


def test_only_cuda_with_graphs_gets_enable_cuda_graph() -> None:
    graphs = GridPlan(ShapeGrid(8, 64), True, True, 16, "cuda")
    assert providers([CUDA, "CPUExecutionProvider"], graphs) == [
        (CUDA, {"enable_cuda_graph": "1"}),
        "CPUExecutionProvider",
    ]
    assert providers([CUDA], GridPlan(ShapeGrid(8, 64), True, False, 16, "cuda")) == [CUDA]
    assert providers([CUDA], None) == [CUDA]


def test_the_warm_up_runs_a_graph_shape_until_captured_and_the_others_once() -> None:
    session = FakeSession()
    encoder = GridEncoder(
        session, ShapeGrid(4, 32), (101, 102, 0), ["mean_2"], ["mean_2"], graphs=GraphCache(True, 2)
    )
    warmed = encoder.warm(lambda length: 4)
    shapes = [(1, 16), (2, 16), (1, 32), (4, 16), (2, 32), (4, 32)]  # cheapest first
    graph_shapes = [s for s in shapes if s[0] <= 2]
    assert warmed.shapes == 6 and warmed.graphs == len(graph_shapes) == 4
    assert warmed.runs == len(graph_shapes) * CAPTURE_RUNS + 2
    assert session.graph_ids.count(NO_GRAPH) == 2 and sorted(set(session.graph_ids) - {NO_GRAPH}) == [
        1,
        2,
        3,
        4,
    ]
    assert encoder.runner is not None and not encoder.runner.warming  # serving never captures
    info = encoder.describe()
    assert (
        info["cuda_graphs"] is True and info["cuda_graphs_captured"] == 4 and info["cuda_graph_replays"] == 0
    )


def test_the_cpu_path_makes_no_device_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def device_only(*args: Any) -> None:
        raise AssertionError("a CUDA-only call on the CPU path")

    monkeypatch.setattr(ort, "copy_tensors", device_only)
    monkeypatch.setattr(ort.OrtValue, "update_inplace", device_only)
    session = FakeSession()
    runner = BoundRunner(session, {"mean_2": (4, np.float32)}, (101, 102, 0))
    (out,) = runner.run((2, 16), np.array([[101, 5, 6, 102]]), np.ones((1, 4), np.int64), None, ["mean_2"])
    assert (out == 4).all() and runner.readback is None


@dataclass
class DeviceValue:
    """A device output as the read-back sees it."""

    array: np.ndarray

    def numpy(self) -> np.ndarray:
        return self.array.copy()


def test_without_copy_tensors_outputs_are_read_back_through_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_transfer(src: Any, dst: Any) -> None:
        raise RuntimeError(
            "Data transfer implementation between source and destination device was not found."
        )

    monkeypatch.setattr(ort, "copy_tensors", no_transfer)
    runner = BoundRunner(FakeSession(), {"mean_2": (4, np.float32)}, (101, 102, 0), device="cuda")
    host = np.zeros((2, 4), np.float32)
    bound = _Bound(None, [host], [DeviceValue(np.full((2, 4), 7, np.float32))], [None])
    runner._read_back(bound)
    runner._read_back(bound)
    assert (host == 7).all() and runner.readback == "numpy"
