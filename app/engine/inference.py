"""Stage 4, inference: a model's batch run on ONNX Runtime and its results written back.

Only the outputs some sequence needs are fetched. Post-processing runs right here: a thread of its own
would cost two hand-offs per batch and save nothing. A fault fails its batch, not the thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine import pooling
from app.engine.batching import Batcher
from app.engine.postprocess import FinishedBatch, split_batch
from app.engine.work import Seq
from app.errors import InternalError, ServiceError, log_fault
from app.model import allocator
from app.model.manifest import HEAD_OUTPUT, POOLER_OUTPUT
from app.model.runtime import OnnxModel
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing


@dataclass
class InferenceStats:
    batches: int = 0
    items: int = 0
    dropped_cancelled: int = 0  # cancelled after assembly, before the run
    busy_s: float = 0.0


class Inference:
    def __init__(
        self,
        model: OnnxModel,
        batcher: Batcher,
        metrics: Metrics,
        tracing: Tracing | None = None,
        calibrate: Callable[[], None] | None = None,
        name: str | None = None,
    ) -> None:
        """``calibrate``: run on the inference thread before its first batch (the session is its alone then);
        ``name``: the model's, in a service of several."""
        self.model = model
        self.name = name
        self.calibrate = calibrate
        self.metrics = metrics
        self.batcher = batcher
        self.tracing = tracing if tracing is not None and tracing.enabled else None
        self.stats = InferenceStats()
        self.fault: str | None = None  # why its inference thread stopped serving (None: it serves)
        self._names = {layer: model.output_name(layer) for layer in range(1, model.num_layers + 1)}
        # (layer, mode) → the graph output with that pooled vector; absent: pooled in numpy.
        self.pooled_names = {
            (layer, mode): name
            for layer in self._names
            for mode in pooling.POOLERS
            if (name := model.pooled_output(layer, mode)) is not None
        }

    def serve(self, batch: list[Seq], trimmer: allocator.Trimmer | None = None) -> None:
        """Run one batch and answer it; any exception fails only this batch's requests not answered yet."""
        live = [seq for seq in batch if not seq.job.cancelled]
        self.stats.dropped_cancelled += len(batch) - len(live)
        try:
            if live:
                self._serve(live)
            if trimmer is not None:
                trimmer.after_batch()
        except Exception as exc:  # a server fault: fail these requests loudly (an error id), keep serving
            where = f"a batch of {len(live)} on model {self.name}" if self.name else f"a batch of {len(live)}"
            fail_jobs(live, log_fault(InternalError(f"{where} failed: {type(exc).__name__}: {exc}"), exc))

    def _serve(self, live: list[Seq]) -> None:
        finished = self.run_batch(live)
        seconds = finished.finished_at - finished.started_at
        self.batcher.ran(seconds)
        waits = finished.begun_at - np.fromiter((item.enqueued_at for item in live), np.float64, len(live))
        self.metrics.batch_ran(seconds, finished.cpu_s, waits, [item.job.urgency for item in live])
        done = split_batch(finished)
        for job, count in done:
            job.finish(count)
        if self.tracing is not None and (spans := [job.trace for job, _ in done if job.trace is not None]):
            now_ns, now = time.time_ns(), time.perf_counter()  # the span, from the times it was measured with
            self.tracing.batch(
                now_ns - int((now - finished.started_at) * 1e9),
                now_ns - int((now - finished.finished_at) * 1e9),
                len(live),
                int(finished.attention_mask.size),
                spans,
                self.name,
            )

    def run_batch(self, items: list[Seq]) -> FinishedBatch:
        """Pad ``items`` into one batch and run the encoder, the masked-LM head and the sparse graph."""
        lengths = np.fromiter((item.length for item in items), np.int64, len(items))
        longest = int(lengths.max())
        attention_mask = (np.arange(longest)[None, :] < lengths[:, None]).astype(np.int64)
        input_ids = np.full((len(items), longest), self.model.manifest.tokenizer.pad_id, dtype=np.int64)
        real = attention_mask.astype(bool)
        input_ids[real] = np.concatenate([item.ids for item in items])
        token_types = None
        if any(item.types is not None for item in items):  # sentence pairs: [CLS] a [SEP] b [SEP]
            token_types = np.zeros_like(input_ids)
            token_types[real] = np.concatenate(
                [item.types if item.types is not None else np.zeros_like(item.ids) for item in items]
            )

        wanted: dict[str, None] = {}  # ordered set of the outputs this batch needs
        last = self._names[self.model.num_layers]
        mask_rows: dict[int, slice] = {}
        positions: list[tuple[int, int]] = []
        sparse_rows: list[int] = []
        seen: set[int] = set()  # needs already planned: a batch has few distinct ones
        for row, item in enumerate(items):
            need = item.need
            if need.mask_positions:
                wanted[last] = None
                mask_rows[row] = slice(len(positions), len(positions) + len(need.mask_positions))
                positions.extend((row, p) for p in need.mask_positions)
            if need.sparse:
                wanted[last] = None
                sparse_rows.append(row)
            if id(need) in seen:
                continue
            seen.add(id(need))
            if need.pooling == pooling.POOLER:
                wanted[POOLER_OUTPUT] = None
            elif need.pooling in pooling.POOLERS and not need.tokens:
                for layer in need.layers:
                    # A prompt left out of the pooling: pooled in numpy from the token states.
                    name = None if need.pool_from else self.pooled_names.get((layer, need.pooling))
                    wanted[name or self._names[layer]] = None
            if need.tokens:
                wanted.update((self._names[layer], None) for layer in need.layers)
            if need.head:
                wanted[HEAD_OUTPUT] = None

        # Its start on the engine's clock, which its sequences' waits end at; its duration in real time.
        begun = self.batcher.clock.now()
        started, cpu = time.perf_counter(), time.thread_time()
        names = list(wanted)
        outputs = dict(
            zip(names, self.model.encode(input_ids, attention_mask, names, token_types), strict=True)
        )
        logits = None
        if positions:
            rows, cols = zip(*positions, strict=True)
            logits = self.model.mask_logits(outputs[last][list(rows), list(cols)])
        sparse = None
        if sparse_rows:  # the rows that asked, cut to their own longest
            width = int(lengths[sparse_rows].max())
            sparse = self.model.sparse_vectors(
                outputs[last][sparse_rows, :width], attention_mask[sparse_rows, :width]
            )
        finished, cpu = time.perf_counter(), time.thread_time() - cpu

        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.busy_s += finished - started
        return FinishedBatch(
            sequences=items,
            attention_mask=attention_mask,
            outputs=outputs,
            mask_rows=mask_rows,
            mask_logits=logits,
            sparse={row: k for k, row in enumerate(sparse_rows)},
            sparse_vectors=sparse,
            output_names=self._names,
            pooled_names=self.pooled_names,
            started_at=started,
            finished_at=finished,
            begun_at=begun,
            cpu_s=cpu,
        )


def fail_jobs(batch: list[Seq], error: ServiceError) -> None:
    for job in {id(seq.job): seq.job for seq in batch}.values():
        job.fail(error)
