"""Prometheus metrics: every name, label and bucket declared once, here, under the ``zhembed_`` prefix.

Each app owns a :class:`Metrics` with its own ``CollectorRegistry`` (not the process-global one), so
tests can build many apps in one process. With several workers (:mod:`app.serving.cluster`) the samples live in
prometheus-client's multiprocess files and a scrape of any worker reads every worker's; gauges then say
how they combine (``livesum``: queue depth, cache bytes, ready workers; ``livemax``: the server-wide
inputs in flight, which every worker reports, and the model) and are pushed by :meth:`Metrics.refresh`
twice a second instead of being read at scrape time. The stages report through the small methods below and never
touch prometheus objects themselves. Dashboards and the autoscaler read these names: renaming one is a
breaking change.
"""

from __future__ import annotations

import bisect
import copy
from collections import Counter as Counter_
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.telemetry.scrape import WrittenFiles

PREFIX = "zhembed_"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds. A cache hit answers in well under a millisecond, a CPU batch of long inputs in a second or
# more: 0.25 ms … 10 s, roughly ×2–2.5 per step.
LATENCY_BUCKETS: tuple[float, ...] = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05)
LATENCY_BUCKETS += (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds the event loop ran late (app.telemetry.loop_lag): 1 ms … 5 s; 20 ms is the most a request may hold it.
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Inputs in one batch: powers of two up to far beyond any sensible max_batch_size.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Tokens in one batch, padding included: up to the largest CUDA token budget we expect.
BATCH_TOKENS_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

TIERS = ("memory", "redis")
REJECTIONS = ("size", "width")  # why a cached value is dropped (app.cache.values)
# Why the supervisor started a worker in place of another (app.serving.supervisor).
REPLACEMENT_REASONS = ("memory", "crash")
# Request urgencies (RFC 9218's 0 … 7; app.engine.priority): the bounded label set of the urgency metrics.
URGENCY_LABELS = tuple(str(u) for u in range(8))


class Metrics:
    def __init__(self, multiprocess_dir: str | None = None, models: Sequence[str] = ()) -> None:
        """``multiprocess_dir``: the directory of a server with several workers (prometheus-client must
        have been imported with ``PROMETHEUS_MULTIPROC_DIR`` naming it); None for one process.
        ``models``: the names of a service of several models, whose request, batch, queue and cache
        metrics then carry a ``model`` label (a service of one has none: its series stay as they were).
        The stages of one model report through its view (:meth:`for_model`)."""
        self.multiprocess_dir = multiprocess_dir
        self.models = tuple(models)
        by = ["model"] if len(self.models) > 1 else []
        # The model this object's stage methods report as: the first of several, None without the label.
        self.model: str | None = self.models[0] if by else None
        self._watched: dict[Any, Callable[[], float]] = {}
        self._request_children: dict[tuple[str, int | str, str, int, str], tuple[Counter, Histogram]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Requests answered, by route (a gRPC call: its method), status (a gRPC call: its status code's "
            "name), protocol (http, grpc) and urgency (0 most urgent ... 7 background; 3 default); with "
            "several models also by model (empty: refused before one was chosen).",
            ["route", "status", "protocol", "urgency", *by],
            registry=r,
        )
        self.request_duration = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from the request's arrival to its response, by route, protocol and urgency (and model).",
            ["route", "protocol", "urgency", *by],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            PREFIX + "queue_duration_seconds",
            "Time an input waited in the batch queue before its batch ran, by its request's urgency (and "
            "model).",
            ["urgency", *by],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenization_duration = Histogram(
            PREFIX + "tokenization_duration_seconds",
            "Time a request waited for its inputs' tokenisation (by model, with several).",
            by,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            PREFIX + "inference_duration_seconds",
            "Time one batch spent in ONNX Runtime (by model, with several).",
            by,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_cpu = Counter(
            PREFIX + "inference_cpu_seconds",
            "CPU time of the thread that runs ONNX Runtime, inside its runs: all of the model's CPU with "
            "one intra-op thread (with more, their share is not counted). Unlike the duration, it "
            "excludes waiting for the interpreter lock after a run.",
            by,
            registry=r,
        )
        self.batch_size = Histogram(
            PREFIX + "batch_size", "Inputs per batch.", by, buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            PREFIX + "batch_tokens",
            "Tokens per batch, padding included (batch size × longest).",
            by,
            buckets=BATCH_TOKENS_BUCKETS,
            registry=r,
        )
        self.computed_tokens = Counter(
            PREFIX + "computed_tokens", "Tokens the encoder computed, padding included.", by, registry=r
        )
        self.padding_tokens = Counter(
            PREFIX + "padding_tokens",
            "Padding tokens the encoder computed; padding share = padding / computed.",
            by,
            registry=r,
        )
        self.queue_depth = Gauge(
            PREFIX + "queue_depth",
            "Inputs waiting in the batch queue, by their requests' urgency (and model).",
            ["urgency", *by],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.inputs_in_flight = Gauge(
            PREFIX + "inputs_in_flight",
            "Inputs admitted and not yet answered (across every worker).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.workers_ready = Gauge(
            PREFIX + "workers_ready",
            "Worker processes that are warmed up and serving.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.cache_hits = Counter(
            PREFIX + "cache_hits", "Vector cache hits, by tier (and model).", ["tier", *by], registry=r
        )
        self.cache_misses = Counter(
            PREFIX + "cache_misses", "Vector cache misses, by tier (and model).", ["tier", *by], registry=r
        )
        self.cache_errors = Counter(
            PREFIX + "cache_errors",
            "Vector cache operations that failed or were dropped, by tier (and model); requests are served "
            "anyway.",
            ["tier", *by],
            registry=r,
        )
        self.cache_rejections = Counter(
            PREFIX + "cache_rejected",
            "Cached values dropped and computed again, by tier, reason (size: not whole float32s; width: "
            "not the key's output's width) (and model).",
            ["tier", "reason", *by],
            registry=r,
        )
        self.cache_bytes = Gauge(
            PREFIX + "cache_bytes",
            "Bytes held by the in-process caches.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.failures = Counter(
            PREFIX + "failures", "Requests answered with an error, by error type.", ["reason"], registry=r
        )
        self.model_info = Gauge(
            PREFIX + "model_info",
            "The loaded model (always 1).",
            ["model", "variant", "provider", "weights"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.worker_replacements = Counter(
            PREFIX + "worker_replacements",
            "Workers that took another's place and got ready, by reason: memory (the other passed "
            "worker-max-memory-mb and retired once this one was ready) or crash (the other exited on its "
            "own). Counted by the replacement.",
            ["reason"],
            registry=r,
        )
        self.worker_memory = Gauge(
            PREFIX + "worker_memory_bytes",
            "Memory of each worker process: PSS, or RSS where the kernel has no PSS. With workers, as the "
            "supervisor measures it every 2 s (labelled by pid); with one process, at scrape time.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.loop_lag = Histogram(
            PREFIX + "event_loop_lag_seconds",
            "How much later than due the worker's event loop woke a timer, measured 20 times a second: the "
            "longest it was held by one piece of work.",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        for reason in REPLACEMENT_REASONS:
            self.worker_replacements.labels(reason)
        self._bind()
        for model in self.models[1:]:  # so every model's series exists from the first scrape
            self.for_model(model)

    def _bind(self) -> None:
        """Look up this view's labelled children once (``labels()`` costs ~5 µs a call); create the
        cache tiers' series so they exist from the first scrape."""
        m = () if self.model is None else (self.model,)
        self._tokenized = self.tokenization_duration.labels(*m) if m else self.tokenization_duration
        self._inference = self.inference_duration.labels(*m) if m else self.inference_duration
        self._cpu = self.inference_cpu.labels(*m) if m else self.inference_cpu
        self._size = self.batch_size.labels(*m) if m else self.batch_size
        self._tokens = self.batch_tokens.labels(*m) if m else self.batch_tokens
        self._computed = self.computed_tokens.labels(*m) if m else self.computed_tokens
        self._padding = self.padding_tokens.labels(*m) if m else self.padding_tokens
        self._queued = [self.queue_duration.labels(u, *m) for u in URGENCY_LABELS]
        self._depths = [self.queue_depth.labels(u, *m) for u in URGENCY_LABELS]
        self._tiers = {
            tier: (
                self.cache_hits.labels(tier, *m),
                self.cache_misses.labels(tier, *m),
                self.cache_errors.labels(tier, *m),
            )
            for tier in TIERS
        }
        rejected = self.cache_rejections
        self._rejected = {(t, why): rejected.labels(t, why, *m) for t in TIERS for why in REJECTIONS}

    def for_model(self, model: str) -> Metrics:
        """The view that one model's stages report through: the same metrics, its ``model`` label (this
        object itself in a service of one model, whose metrics have no such label)."""
        if self.model is None or model == self.model:
            return self
        view = copy.copy(self)  # shares the registry, the metrics and what is watched
        view.model = model
        view._bind()
        return view

    # --- what the stages report -------------------------------------------------------------------

    def request_done(
        self,
        route: str,
        status: int | str,
        seconds: float,
        protocol: str = "http",
        urgency: int = 3,
        model: str = "",
    ) -> None:
        """One request answered; ``model``: the one that served it (labelled with several; empty: refused
        before one was chosen)."""
        # The labelled children, looked up once per (route, status, protocol, urgency, model): ``labels()``
        # costs ~5 µs a request. Bounded: routes are the app's own (or "unmatched"), gRPC methods the
        # services', statuses the few the app answers, urgencies 0 … 7, models the served ones.
        key = (route, status, protocol, urgency, model)
        children = self._request_children.get(key)
        if children is None:
            by = (model,) if self.model is not None else ()
            children = (
                self.requests.labels(route, str(status), protocol, URGENCY_LABELS[urgency], *by),
                self.request_duration.labels(route, protocol, URGENCY_LABELS[urgency], *by),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def failure(self, reason: str) -> None:
        self.failures.labels(reason).inc()

    def batch_assembled(self, size: int, real_tokens: int, computed_tokens: int) -> None:
        self._size.observe(size)
        self._tokens.observe(computed_tokens)
        self._computed.inc(computed_tokens)
        self._padding.inc(computed_tokens - real_tokens)

    def batch_ran(
        self, seconds: float, cpu_seconds: float, queued: np.ndarray, urgencies: list[int] | None = None
    ) -> None:
        """One batch's inference time (wall and the running thread's CPU) and how long each of its inputs
        had waited (seconds, one each), by their urgencies (one each; None: all the default)."""
        self._inference.observe(seconds)
        self._cpu.inc(cpu_seconds)
        if not urgencies:
            observe_many(self._queued[3], queued)
            return
        first = urgencies[0]
        if urgencies.count(first) == len(urgencies):  # the common case: one urgency in the batch
            observe_many(self._queued[first], queued)
            return
        each = np.array(urgencies)
        for u in np.unique(each).tolist():
            observe_many(self._queued[u], queued[each == u])

    def tokenized(self, seconds: float) -> None:
        self._tokenized.observe(seconds)

    def cache_lookup(self, tier: str, hits: int, misses: int) -> None:
        hit, miss, _ = self._tiers[tier]
        if hits:
            hit.inc(hits)
        if misses:
            miss.inc(misses)

    def cache_error(self, tier: str, count: int = 1) -> None:
        self._tiers[tier][2].inc(count)

    def cache_rejected(self, tier: str, reason: str, count: int) -> None:
        self._rejected[tier, reason].inc(count)

    def watch(
        self,
        queue_depth: Callable[[int], float],
        in_flight: Callable[[], float],
        cache_bytes: Callable[[], float],
        memory_bytes: Callable[[], float],
    ) -> None:
        """Gauges read from the engine, the cache and the process: at scrape time, or by :meth:`refresh`
        with workers. ``queue_depth`` takes an urgency (0 … 7): this view's model's queue (the other
        models' through :meth:`watch_queue` on their views)."""
        self._watch(
            {
                self.inputs_in_flight: in_flight,
                self.cache_bytes: cache_bytes,
                self.worker_memory: memory_bytes,
            }
        )
        self.watch_queue(queue_depth)

    def watch_queue(self, queue_depth: Callable[[int], float]) -> None:
        """The queue depth gauges of this view's model, read from ``queue_depth(urgency)``."""
        self._watch({gauge: partial(queue_depth, u) for u, gauge in enumerate(self._depths)})

    def _watch(self, gauges: dict[Any, Callable[[], float]]) -> None:
        self._watched.update(gauges)  # in place: the views share it
        if self.multiprocess_dir is None:
            for gauge, read in gauges.items():
                gauge.set_function(read)

    def refresh(self) -> None:
        """Push the watched values into their gauges (multiprocess mode, where a scrape cannot call them)."""
        for gauge, read in self._watched.items():
            gauge.set(read())

    def ready(self, ready: bool) -> None:
        self.workers_ready.set(int(ready))

    def worker_replaced(self, reason: str) -> None:
        self.worker_replacements.labels(reason).inc()

    def set_model(self, model: str, variant: str, provider: str, weights: str, clear: bool = True) -> None:
        """One loaded model's info series; ``clear``: drop those of any model set before (the first of a
        service's models clears, the others add)."""
        if clear and self.multiprocess_dir is None:  # (with workers each starts afresh: nothing to clear)
            self.model_info.clear()
        self.model_info.labels(model, variant, provider, weights).set(1)

    def exposition(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        WrittenFiles(registry, path=self.multiprocess_dir)
        return generate_latest(registry)


def observe_many(histogram: Histogram, amounts: np.ndarray) -> None:
    """``histogram.observe(a)`` for each of ``amounts``, in one pass: one bucket increment per bucket hit
    and one to the sum, instead of a locked increment or two per value (a batch of 256 inputs observed
    one by one cost ~2.4 µs each). Same buckets as ``observe`` (the first upper bound ≥ the amount);
    reads prometheus-client's own bucket values (``_upper_bounds``, ``_buckets``, ``_sum``), so a test
    checks it against ``observe``. For a histogram without labels, or one labelled child of one.
    """
    if len(amounts) < _NUMPY_FROM:  # numpy's per-call cost exceeds bisecting a few values
        hits = Counter_(bisect.bisect_left(histogram._upper_bounds, a) for a in amounts.tolist())
        for index, count in hits.items():
            histogram._buckets[index].inc(count)
    else:
        bounds = np.asarray(histogram._upper_bounds, dtype=np.float64)
        counts = np.bincount(np.searchsorted(bounds, amounts, side="left"), minlength=len(bounds))
        for bucket in np.flatnonzero(counts).tolist():
            histogram._buckets[bucket].inc(int(counts[bucket]))
    histogram._sum.inc(float(np.sum(amounts)))


# Values from which observe_many bins with numpy rather than bisect (measured: equal cost near 30).
_NUMPY_FROM = 32
