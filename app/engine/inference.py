"""Stage 4, inference: a dedicated thread runs one padded batch at a time on ONNX Runtime.

ONNX Runtime releases the GIL while it computes, so the event loop, the tokenisation thread and the
assembler keep working during a batch. The hand-over from the assembler is a single slot, freed when a
batch has run: the next batch is cut from everything that arrived meanwhile. Only the outputs some item of the batch needs are fetched.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from app.engine import pooling
from app.engine.postprocess import FinishedBatch, PostProcessing
from app.engine.work import Sequence
from app.errors import InternalError
from app.metrics import Metrics
from app.model.manifest import POOLER_OUTPUT
from app.model.runtime import OnnxModel

log = logging.getLogger(__name__)


@dataclass
class InferenceStats:
    batches: int = 0
    items: int = 0
    dropped_cancelled: int = 0  # cancelled after assembly, before the run
    busy_s: float = 0.0


class Inference:
    def __init__(self, model: OnnxModel, post: PostProcessing, metrics: Metrics) -> None:
        self.model = model
        self.metrics = metrics
        self.post = post
        self.stats = InferenceStats()
        self._handoff: queue.Queue[list[Sequence] | None] = queue.Queue(maxsize=1)
        self._slot = threading.Semaphore(1)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="zhembed-inference", daemon=True)
        self._names = {layer: model.output_name(layer) for layer in range(1, model.num_layers + 1)}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._slot.release()  # wake an assembler waiting for the slot
        self._handoff.put(None)
        self._thread.join(timeout=30)

    def wait_for_slot(self) -> bool:
        """Block until the stage can take one more batch; False once stopping."""
        self._slot.acquire()
        return not self._stopped

    def deliver(self, batch: list[Sequence]) -> None:
        # Never blocks: the slot was taken by wait_for_slot.
        self._handoff.put_nowait(batch)

    def _run(self) -> None:
        while (batch := self._handoff.get()) is not None:
            try:
                self._run_one(batch)
            finally:
                # The next batch is cut only now, from everything that arrived while this one ran: the
                # later the cut, the more lengths the assembler can choose from, the less padding.
                # Cutting costs microseconds; padding the arrays happens here, in run_batch, anyway.
                self._slot.release()

    def _run_one(self, batch: list[Sequence]) -> None:
        live = [seq for seq in batch if not seq.job.cancelled]
        self.stats.dropped_cancelled += len(batch) - len(live)
        if not live:
            return
        try:
            finished = self.run_batch(live)
        except Exception as exc:  # a server fault: fail these requests loudly, keep serving
            log.exception("inference failed for a batch of %d", len(live))
            error = InternalError(f"inference failed: {type(exc).__name__}: {exc}")
            for job in {id(seq.job): seq.job for seq in live}.values():
                job.fail(error)
            return
        self.metrics.batch_ran(
            finished.finished_at - finished.started_at,
            [finished.started_at - item.enqueued_at for item in live],
        )
        self.post.put(finished)

    def run_batch(self, items: list[Sequence]) -> FinishedBatch:
        """Pad ``items`` into one batch, run the encoder (and the masked-LM head on masked positions)."""
        longest = max(item.length for item in items)
        input_ids = np.full((len(items), longest), self.model.manifest.tokenizer.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(items), longest), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, : item.length] = item.ids
            attention_mask[row, : item.length] = 1

        wanted: dict[str, None] = {}  # ordered set of the outputs this batch needs
        last = self._names[self.model.num_layers]
        mask_rows: dict[int, slice] = {}
        positions: list[tuple[int, int]] = []
        for row, item in enumerate(items):
            need = item.need
            if need.pooling == pooling.POOLER:
                wanted[POOLER_OUTPUT] = None
            if need.pooling in pooling.POOLERS or need.tokens:
                wanted.update((self._names[layer], None) for layer in need.layers)
            if need.mask_positions:
                wanted[last] = None
                mask_rows[row] = slice(len(positions), len(positions) + len(need.mask_positions))
                positions.extend((row, p) for p in need.mask_positions)

        started = time.perf_counter()
        names = list(wanted)
        outputs = dict(zip(names, self.model.encode(input_ids, attention_mask, names), strict=True))
        logits = None
        if positions:
            rows, cols = zip(*positions, strict=True)
            logits = self.model.mask_logits(outputs[last][list(rows), list(cols)])
        finished = time.perf_counter()

        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.busy_s += finished - started
        return FinishedBatch(
            sequences=items,
            attention_mask=attention_mask,
            outputs=outputs,
            mask_rows=mask_rows,
            mask_logits=logits,
            output_names=self._names,
            started_at=started,
            finished_at=finished,
        )
