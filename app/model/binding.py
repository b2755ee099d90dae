"""Fixed buffers per grid shape, bound with ONNX Runtime's IOBinding, and small shapes replayed as CUDA graphs.

With batches on the grid (:mod:`app.model.grid`) each shape has input buffers of its own, made once: the
host arrays a batch is written into (:func:`app.model.grid.fill`) and, on CUDA, device OrtValues that the
host arrays are copied into (``update_inplace``), bound once to an IOBinding per set of pooled outputs
(the ``[rows, dim]`` vectors, nothing per token). Each pooled output is bound to a buffer of its own: on
the CPU the host array itself, which ONNX Runtime writes into; on CUDA a device OrtValue, copied after the
run into a host array made once per shape (``onnxruntime.copy_tensors`` where it can, see
:meth:`BoundRunner._read_back`). A run then allocates no input or output buffer, and the arrays
:meth:`BoundRunner.run` returns are the shape's own, valid until that shape runs again: post-processing
copies out of them (fancy indexing) before the inference thread's next batch.

**CUDA graphs.** With the CUDA provider option ``enable_cuda_graph`` a session captures the kernels of a
run and replays them after, one launch instead of hundreds: for small batches, where launching is most of
the cost, the gain is largest. What ONNX Runtime requires (its CUDA provider; PR 9978, 15005, 19636):

- every node of the graph on the CUDA provider (none on the CPU): otherwise it warns that the session
  will not use CUDA graphs, and runs as usual;
- IOBinding, with inputs and outputs on the device at the same addresses, of the same shapes, every run:
  one captured graph per grid shape and output set, numbered by the run option ``gpu_graph_id`` (1, 2, …;
  -1 runs without capture or replay: every other run of the encoder session must say -1, or it would be
  captured as graph 0);
- two ordinary runs of an id before the third captures it (memory patterns are planned in the second),
  and capture and replay on one thread (the provider's state is per thread): the inference thread, which
  warms the grid before its first batch (:meth:`app.model.shaped.GridEncoder.warm`);
- no control flow (If, Loop, Scan), which a BERT encoder has none of.

:class:`GraphCache` is that bookkeeping, apart from ONNX Runtime, so that it is tested on the CPU (which
cannot capture) with a fake session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from app.model.grid import buffers, fill

log = logging.getLogger(__name__)

GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run option: which captured graph a run is (-1: none)
NO_GRAPH = -1
CAPTURE_RUNS = 3  # runs of a graph id until it is captured: two ordinary ones, then the capture

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DTYPES: dict[str, type[np.generic]] = {"tensor(float)": np.float32, "tensor(float16)": np.float16}

Shape = tuple[int, int]
Key = tuple[Shape, tuple[str, ...]]


class Session(Protocol):
    """What the runner uses of an ``onnxruntime.InferenceSession`` (a fake in tests)."""

    def io_binding(self) -> Any: ...
    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None: ...
    def get_outputs(self) -> Sequence[Any]: ...


def bindable(session: Session, names: Sequence[str]) -> dict[str, tuple[int, type[np.generic]]]:
    """Of the session's outputs named in ``names``, those with a fixed ``[batch, dim]`` shape and a float
    type: each one's dim and dtype. Outputs per token are never bound (their shape is the batch's)."""
    found = {}
    for meta in session.get_outputs():
        shape = list(meta.shape)
        if meta.name in names and len(shape) == 2 and isinstance(shape[1], int) and meta.type in DTYPES:
            found[meta.name] = (shape[1], DTYPES[meta.type])
    return found


@dataclass
class GraphCache:
    """Which runs of the bound path are captured as CUDA graphs and which replay them.

    A key (grid shape, outputs) of at most ``max_rows`` rows gets a graph id while the grid is warmed
    (``warming``); a key first seen later never does (a capture costs runs the batch would wait for).
    ``enabled`` False: every run says :data:`NO_GRAPH`.
    """

    enabled: bool
    max_rows: int
    capture_runs: int = CAPTURE_RUNS
    ids: dict[Key, int] = field(default_factory=dict)
    runs: dict[Key, int] = field(default_factory=dict)
    replays: int = 0

    def graph_id(self, key: Key, warming: bool) -> int:
        """The ``gpu_graph_id`` of the next run of ``key``."""
        if not self.enabled:
            return NO_GRAPH
        if key not in self.ids:
            if not warming or key[0][0] > self.max_rows:
                return NO_GRAPH
            self.ids[key] = len(self.ids) + 1  # ONNX Runtime's graph 0 is the one of runs that say none
        return self.ids[key]

    def ran(self, key: Key) -> None:
        """A run of ``key`` with its graph id has returned."""
        runs = self.runs[key] = self.runs.get(key, 0) + 1
        if runs > self.capture_runs:
            self.replays += 1

    def captured(self, key: Key) -> bool:
        return self.runs.get(key, 0) >= self.capture_runs

    @property
    def count(self) -> int:
        """How many graphs are captured."""
        return sum(1 for key in self.ids if self.captured(key))


@dataclass
class _Slot:
    """One grid shape's input buffers: host arrays, and on CUDA the device values bound to them."""

    host: tuple[np.ndarray, np.ndarray, np.ndarray]
    values: list[Any]  # the OrtValue each input is bound to
    bound: dict[tuple[str, ...], _Bound] = field(default_factory=dict)


@dataclass
class _Bound:
    """One output set's binding on a shape: its host arrays, the values bound (on the CPU the host arrays'
    own), and the host arrays as OrtValues for the copy back from the device."""

    binding: Any
    hosts: list[np.ndarray]
    values: list[Any]
    readback: list[Any]


OrtValueOf = Callable[[np.ndarray], Any]


class BoundRunner:
    """Runs an encoder session through IOBinding on fixed buffers per grid shape (see the module).

    ``device`` "cpu" binds the host arrays themselves; "cuda" binds device OrtValues (device 0) and copies
    the pooled outputs back into host arrays. ``graphs``: which runs capture and replay CUDA graphs (its
    ``enabled`` only where the session was made with ``enable_cuda_graph``).
    """

    def __init__(
        self,
        session: Session,
        outputs: dict[str, tuple[int, type[np.generic]]],
        ends: tuple[int, int, int],
        device: str = "cpu",
        graphs: GraphCache | None = None,
    ) -> None:
        self.session = session
        self.outputs = outputs
        self.ends = ends
        self.device = device
        self.graphs = graphs if graphs is not None else GraphCache(False, 0)
        self.warming = False
        self._slots: dict[Shape, _Slot] = {}
        self._options: dict[int, Any] = {}
        self.runs = 0
        # How device outputs reach the host arrays (None: not yet; "copy_tensors" or "numpy").
        self.readback: str | None = None

    def covers(self, names: Sequence[str]) -> bool:
        """Whether every one of ``names`` is a bound output (else the caller runs the session as usual)."""
        return bool(names) and all(name in self.outputs for name in names)

    def inputs(self, shape: Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The host buffers of ``shape`` (made on first use), which the plain path feeds too."""
        return self._slot(shape).host

    def run(
        self,
        shape: Shape,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None,
        names: Sequence[str],
    ) -> list[np.ndarray]:
        """The pooled ``names`` [rows, dim] of a batch padded to ``shape``: the batch's own rows, views
        of the shape's output buffers (valid until ``shape`` runs again)."""
        slot = self._slot(shape)
        fill(slot.host, input_ids, attention_mask, token_type_ids, self.ends)
        if self.device != "cpu":
            for value, host in zip(slot.values, slot.host, strict=True):
                value.update_inplace(host)  # a copy into the same device buffer: the graph reads it there
        key = (shape, tuple(names))
        bound = slot.bound.get(key[1]) or self._bind(slot, shape, key[1])
        graph = self.graphs.graph_id(key, self.warming)
        self.session.run_with_iobinding(bound.binding, self._run_options(graph))
        if graph != NO_GRAPH:
            self.graphs.ran(key)
        if self.device != "cpu":
            self._read_back(bound)
        self.runs += 1
        rows = len(input_ids)
        return [host[:rows] for host in bound.hosts]

    def _read_back(self, bound: _Bound) -> None:
        """Copy the device outputs into the host arrays made once: ``onnxruntime.copy_tensors`` where this
        ONNX Runtime has a data transfer for the device registered (it had none even CPU to CPU on the
        1.32 CPU wheel), else through ``OrtValue.numpy()`` (a host array made per run), said once."""
        if self.readback != "numpy":
            try:
                ort.copy_tensors(bound.values, bound.readback)
                self.readback = "copy_tensors"
                return
            except RuntimeError as exc:
                if self.readback == "copy_tensors":  # it worked before: this is a fault of its own
                    raise
                log.warning("copy_tensors cannot read the outputs back (%s): through OrtValue.numpy()", exc)
                self.readback = "numpy"
        for host, value in zip(bound.hosts, bound.values, strict=True):
            np.copyto(host, value.numpy())

    def _slot(self, shape: Shape) -> _Slot:
        slot = self._slots.get(shape)
        if slot is None:
            host = buffers(shape)
            slot = self._slots[shape] = _Slot(host, [self._value(array) for array in host])
        return slot

    def _value(self, array: np.ndarray) -> Any:
        """The OrtValue bound to ``array``'s place: the array itself on the CPU, a device buffer on CUDA."""
        if self.device == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(array)
        return ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, self.device, 0)

    def _bind(self, slot: _Slot, shape: Shape, names: tuple[str, ...]) -> _Bound:
        binding = self.session.io_binding()
        for name, value in zip(INPUTS, slot.values, strict=True):
            binding.bind_ortvalue_input(name, value)
        hosts = [np.zeros((shape[0], self.outputs[n][0]), self.outputs[n][1]) for n in names]
        values = [self._value(host) for host in hosts]
        for name, value in zip(names, values, strict=True):
            binding.bind_ortvalue_output(name, value)
        readback = values if self.device == "cpu" else [ort.OrtValue.ortvalue_from_numpy(h) for h in hosts]
        bound = slot.bound[names] = _Bound(binding, hosts, values, readback)
        return bound

    def _run_options(self, graph: int) -> Any:
        if not self.graphs.enabled:
            return None
        options = self._options.get(graph)
        if options is None:
            options = self._options[graph] = ort.RunOptions()
            options.add_run_config_entry(GRAPH_ID, str(graph))
        return options

    def shapes(self) -> int:
        """How many grid shapes have buffers."""
        return len(self._slots)
