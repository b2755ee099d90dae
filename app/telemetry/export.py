"""Where spans go: the SDK's batch processor and the OTLP exporter, bounded and counted.

The queue is bounded; a span that finds it full is refused and counted, as is every span in an export the
collector failed; after a deadline exports give up at once, so a slow or absent collector never holds a
request or the process's shutdown (:meth:`app.telemetry.tracing.Tracing.shutdown`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

log = logging.getLogger(__name__)


class Counts:
    """Span counts shared by the processor (request threads) and the exporter (the export thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted = 0  # sampled spans handed to the processor
        self.overflow = 0  # of those, pushed out of a full queue
        self.delivered = 0  # in batches the collector accepted
        self.failed = 0  # in batches whose export failed


class CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it delivers and what it fails; past ``deadline`` it fails at once."""

    def __init__(self, inner: SpanExporter, counts: Counts) -> None:
        self.inner = inner
        self.counts = counts
        self.deadline: float | None = None  # time.monotonic() after which exports are given up
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        if self.deadline is None or time.monotonic() < self.deadline:
            try:
                result = self.inner.export(spans)
            except Exception:
                log.debug("span export failed", exc_info=True)
        with self.counts.lock:
            if result is SpanExportResult.SUCCESS:
                self.counts.delivered += len(spans)
            else:
                self.counts.failed += len(spans)
        return result

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.inner.shutdown()
        except Exception:
            log.debug("span exporter shutdown failed", exc_info=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans it is given and refusing (and counting) those that
    find its queue full.

    SDK 1.45's ``BatchProcessor.emit`` would push the oldest span out of its bounded deque, with only a
    (de-duplicated, yet costly) warning and, when the SDK's internal metrics are on, a metric. So the
    queue's length is read first and a span that finds it full is not emitted but counted; emits are
    serialised by the counts' lock, and the export thread only takes spans out, so none is lost uncounted.
    ``_queue`` is private: should a later SDK lack it, the SDK drops instead and the reconciled count of
    :attr:`app.telemetry.tracing.Tracing.dropped` after shutdown (accepted minus delivered) still holds.
    """

    def __init__(self, exporter: CountingExporter, counts: Counts, **options: Any) -> None:
        super().__init__(exporter, **options)
        self._counts = counts
        queue = getattr(self._batch_processor, "_queue", None)
        self._queue: deque[Any] | None = queue if isinstance(queue, deque) and queue.maxlen else None

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        queue = self._queue
        with self._counts.lock:
            self._counts.accepted += 1
            if queue is not None and len(queue) >= (queue.maxlen or 0):
                self._counts.overflow += 1
                return
            super().on_end(span)
