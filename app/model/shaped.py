"""The encoder's runs on the grid of shapes: pad, run (bound where it can), cut back; and the grid's warm-up.

With ``shape_grid`` on (auto: on CUDA) :meth:`app.model.runtime.OnnxModel.encode` hands every batch here.
A batch is written into its grid shape's buffers (:func:`app.model.grid.fill`); a batch that wants only
pooled vectors (the usual /embed) runs through IOBinding on that shape's fixed buffers, small shapes
replayed as CUDA graphs (:mod:`app.model.binding`); one that wants more (token states, several layers
for the masked-LM head or the sparse graph, a tagger's logits) runs the session as usual on the same
buffers. Either way the outputs are cut back to the batch's own rows and tokens before anyone reads them:
padding never reaches an answer.

:meth:`GridEncoder.warm` runs every grid shape the batch limits allow once (a shape captured as a CUDA
graph: until captured), on the inference thread before its first batch (the engine's calibration step,
which ``/ready`` waits for); how many shapes and how long it took are in ``/info`` and the start-up log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from app.model.binding import GRAPH_ID, INPUTS, NO_GRAPH, BoundRunner, GraphCache, bindable
from app.model.grid import Buffers, ShapeGrid, buffers, fill, wanted, warm_shapes
from app.model.manifest import HEAD_OUTPUT, POOLER_OUTPUT, Manifest
from app.settings import Settings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"


@dataclass(frozen=True)
class Warmed:
    """What the grid's warm-up ran: its shapes, how many runs, captured graphs, seconds."""

    shapes: int
    runs: int
    graphs: int
    seconds: float


class GridEncoder:
    """Runs one encoder session on the grid (see the module).

    Args:
        session: the encoder's ``onnxruntime.InferenceSession``.
        grid: the shapes.
        ends: the tokenizer's (cls, sep, pad) ids, for the padding.
        pooled: the encoder outputs of pooled vectors ``[batch, dim]``, which IOBinding may bind.
        warm_fetch: what the warm-up fetches: what a default request does.
        device: "cpu" or "cuda" (where IOBinding's buffers live).
        io_binding: bind pooled outputs on fixed buffers (False: every run is the session's plain run).
        graphs: which bound runs capture and replay CUDA graphs.
        plain_options: the run options of the plain runs (on a session with CUDA graphs: ``gpu_graph_id``
            -1, so that they are never captured).
    """

    def __init__(
        self,
        session: Any,
        grid: ShapeGrid,
        ends: tuple[int, int, int],
        pooled: Sequence[str],
        warm_fetch: list[str],
        device: str = "cpu",
        io_binding: bool = True,
        graphs: GraphCache | None = None,
        plain_options: Any = None,
    ) -> None:
        self.session = session
        self.grid = grid
        self.ends = ends
        self.warm_fetch = warm_fetch
        self.plain_options = plain_options
        self.runner = (
            BoundRunner(session, bindable(session, pooled), ends, device, graphs) if io_binding else None
        )
        # Outputs with a dimension per token (the second not fixed): cut back to the batch's length too.
        self._per_token = {
            meta.name
            for meta in session.get_outputs()
            if len(meta.shape) >= 2 and not isinstance(meta.shape[1], int)
        }
        self._buffers: dict[tuple[int, int], Buffers] = {}
        self.warmed: Warmed | None = None

    def encode(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        outputs: list[str],
        token_type_ids: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """:meth:`app.model.runtime.OnnxModel.encode` on the grid: the outputs of the batch's own rows
        (and tokens), padded to its grid shape to run."""
        rows, longest = input_ids.shape
        shape = self.grid.shape(rows, longest)
        if self.runner is not None and self.runner.covers(outputs):
            return self.runner.run(shape, input_ids, attention_mask, token_type_ids, outputs)
        into = self.runner.inputs(shape) if self.runner is not None else self._inputs(shape)
        fill(into, input_ids, attention_mask, token_type_ids, self.ends)
        results = self.session.run(outputs, dict(zip(INPUTS, into, strict=True)), self.plain_options)
        return [
            result[:rows, :longest] if name in self._per_token else result[:rows]
            for name, result in zip(outputs, results, strict=True)
        ]

    def _inputs(self, shape: tuple[int, int]) -> Buffers:
        if shape not in self._buffers:
            self._buffers[shape] = buffers(shape)
        return self._buffers[shape]

    def warm(self, room: Callable[[int], int], clock: Callable[[], float] = time.perf_counter) -> Warmed:
        """Run each grid shape a batch within the limits may take once (``room``: how many sequences of a
        length one batch may hold), a shape that is to be a CUDA graph until it is captured; on the
        thread that will run the batches (CUDA graphs are per thread)."""
        started = clock()
        shapes = warm_shapes(self.grid, room)
        # The graphs to capture: of the shapes a default request runs bound.
        bound = self.runner is not None and self.runner.covers(self.warm_fetch)
        graphs = self.runner.graphs if self.runner is not None and bound else None
        runs = 0
        if self.runner is not None:
            self.runner.warming = True
        try:
            for rows, length in shapes:
                ids = np.full((rows, length), self.ends[2], np.int64)
                ids[:, 0], ids[:, -1] = self.ends[0], self.ends[1]
                mask = np.ones_like(ids)
                key = ((rows, length), tuple(self.warm_fetch))
                captured = graphs is not None and graphs.graph_id(key, warming=True) != NO_GRAPH
                for _ in range(graphs.capture_runs if graphs is not None and captured else 1):
                    self.encode(ids, mask, self.warm_fetch)
                    runs += 1
        finally:
            if self.runner is not None:
                self.runner.warming = False
        count = self.runner.graphs.count if self.runner is not None else 0
        self.warmed = Warmed(len(shapes), runs, count, clock() - started)
        log.info(
            "shape grid warmed: %d shapes (of %d) in %.2f s, %d runs, %d CUDA graphs captured",
            self.warmed.shapes,
            self.grid.size(),
            self.warmed.seconds,
            runs,
            self.warmed.graphs,
        )
        return self.warmed

    def describe(self) -> dict[str, Any]:
        """What /info shows of the grid: its bounds, its size, the warm-up and the graphs."""
        graphs = self.runner.graphs if self.runner is not None else None
        return {
            "lengths": self.grid.lengths(),
            "rows": self.grid.row_counts(),
            "shapes": self.grid.size(),
            "warmed_shapes": self.warmed.shapes if self.warmed is not None else None,
            "warmup_s": round(self.warmed.seconds, 3) if self.warmed is not None else None,
            "io_binding": self.runner is not None,
            "bound_runs": self.runner.runs if self.runner is not None else 0,
            "readback": self.runner.readback if self.runner is not None else None,
            "cuda_graphs": graphs is not None and graphs.enabled,
            "cuda_graph_max_rows": graphs.max_rows if graphs is not None and graphs.enabled else None,
            "cuda_graphs_captured": graphs.count if graphs is not None else 0,
            "cuda_graph_replays": graphs.replays if graphs is not None else 0,
        }


@dataclass(frozen=True)
class GridPlan:
    """What the settings make of the grid for one model on one provider (:func:`plan`)."""

    grid: ShapeGrid
    io_binding: bool
    cuda_graphs: bool
    graph_max_rows: int
    device: str  # where IOBinding's buffers live: "cpu" or "cuda"


def plan(settings: Settings, provider: str, max_length: int) -> GridPlan | None:
    """The grid the settings ask for on ``provider`` (None: batches keep their exact shapes). CUDA graphs
    only on CUDA, and only through IOBinding."""
    if not wanted(settings.shape_grid, provider):
        return None
    cuda = provider == CUDA
    return GridPlan(
        ShapeGrid(settings.max_batch_size, max_length),
        settings.io_binding,
        cuda and settings.io_binding and settings.cuda_graphs,
        settings.cuda_graph_max_rows,
        "cuda" if cuda else "cpu",
    )


def providers(names: list[str], grid: GridPlan | None) -> list[str | tuple[str, dict[str, str]]]:
    """The encoder session's providers: with CUDA graphs, the CUDA provider's ``enable_cuda_graph`` on
    (the encoder's session only: the masked-LM head's and the sparse graph's runs are never bound)."""
    if grid is None or not grid.cuda_graphs:
        return list(names)
    return [(name, {"enable_cuda_graph": "1"}) if name == CUDA else name for name in names]


class Model(Protocol):
    """What :func:`build` reads of :class:`app.model.runtime.OnnxModel` (which imports this module)."""

    manifest: Manifest

    @property
    def num_layers(self) -> int: ...
    @property
    def has_head(self) -> bool: ...
    def pooled_output(self, layer: int, mode: str) -> str | None: ...
    def output_name(self, layer: int) -> str: ...


def build(model: Model, session: Any, grid: GridPlan) -> GridEncoder:
    """The grid encoder of ``model``'s encoder ``session``, warmed on what a default request fetches."""
    layer = model.num_layers
    if model.has_head:
        fetch = [HEAD_OUTPUT]
    else:
        fetch = [model.pooled_output(layer, model.manifest.defaults.pooling) or model.output_name(layer)]
    plain = None
    if grid.cuda_graphs:  # no plain run of this session may be captured (as graph 0)
        plain = ort.RunOptions()
        plain.add_run_config_entry(GRAPH_ID, str(NO_GRAPH))
    info = model.manifest.tokenizer
    return GridEncoder(
        session,
        grid.grid,
        (info.cls_id, info.sep_id, info.pad_id),
        [name for per_layer in model.manifest.pooled_outputs.values() for name in per_layer.values()]
        + [POOLER_OUTPUT],
        fetch,
        grid.device,
        grid.io_binding,
        GraphCache(grid.cuda_graphs, grid.graph_max_rows),
        plain,
    )
