"""/metrics: the declared names under one prefix, an exposition prometheus_client parses, and values that
move as expected after known requests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from app.telemetry.metrics import LATENCY_BUCKETS, Metrics, observe_many
from tests.app.conftest import Running, metric, samples, serving, with_cache

# The names dashboards and the autoscaler read: a rename must fail here first.
EXPECTED = {
    "zhembed_requests": "counter",
    "zhembed_request_duration_seconds": "histogram",
    "zhembed_queue_duration_seconds": "histogram",
    "zhembed_tokenization_duration_seconds": "histogram",
    "zhembed_inference_duration_seconds": "histogram",
    "zhembed_batch_size": "histogram",
    "zhembed_batch_tokens": "histogram",
    "zhembed_computed_tokens": "counter",
    "zhembed_padding_tokens": "counter",
    "zhembed_queue_depth": "gauge",
    "zhembed_inputs_in_flight": "gauge",
    "zhembed_cache_hits": "counter",
    "zhembed_cache_misses": "counter",
    "zhembed_cache_errors": "counter",
    "zhembed_cache_rejected": "counter",
    "zhembed_cache_bytes": "gauge",
    "zhembed_failures": "counter",
    "zhembed_model_info": "gauge",
}


@pytest.fixture(scope="module")
def cached(tiny_settings: Settings) -> Iterator[Running]:
    with serving(with_cache(tiny_settings, None)) as running:
        yield running


@pytest.fixture()
def cclient(cached: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cached.url, timeout=30) as c:
        yield c


def test_exposition_parses_with_every_declared_name(cclient: httpx.Client) -> None:
    cclient.post("/embed", json={"inputs": "解析"})
    response = cclient.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    for name, kind in EXPECTED.items():
        assert families.get(name) == kind, name
    assert all(name.startswith("zhembed_") for name in families)


def test_duration_buckets_are_the_declared_ones() -> None:
    metrics = Metrics()
    metrics.tokenized(0.001)
    text = metrics.exposition().decode()
    bounds = [
        float(s.labels["le"])
        for f in text_string_to_metric_families(text)
        if f.name == "zhembed_tokenization_duration_seconds"
        for s in f.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    ]
    assert bounds == list(LATENCY_BUCKETS) and bounds[0] <= 0.001


def test_metrics_move_after_known_requests(cclient: httpx.Client, cached: Running) -> None:
    texts = ["指标一", "指标二二", "指标三三三"]
    before = {
        "ok": metric(
            cclient, "zhembed_requests_total", route="/embed", status="200", protocol="http", urgency="3"
        ),
        "misses": metric(cclient, "zhembed_cache_misses_total", tier="memory"),
        "hits": metric(cclient, "zhembed_cache_hits_total", tier="memory"),
        "computed": metric(cclient, "zhembed_computed_tokens_total"),
        "padding": metric(cclient, "zhembed_padding_tokens_total"),
        "batches": metric(cclient, "zhembed_batch_size_count"),
        "queued": metric(cclient, "zhembed_queue_duration_seconds_count", urgency="3"),
        "validation": metric(cclient, "zhembed_failures_total", reason="validation"),
        "duration": metric(
            cclient, "zhembed_request_duration_seconds_count", route="/embed", protocol="http", urgency="3"
        ),
    }
    assert cclient.post("/embed", json={"inputs": texts}).status_code == 200
    assert cclient.post("/embed", json={"inputs": texts}).status_code == 200  # all from the cache
    assert cclient.post("/embed", json={"inputs": "x", "pooling": "median"}).status_code == 422
    assert cclient.get("/no-such-route").status_code == 404

    def delta(key: str, name: str, **labels: str) -> float:
        return metric(cclient, name, **labels) - before[key]

    assert (
        delta("ok", "zhembed_requests_total", route="/embed", status="200", protocol="http", urgency="3") == 2
    )
    assert (
        metric(cclient, "zhembed_requests_total", route="/embed", status="422", protocol="http", urgency="3")
        >= 1
    )
    assert (
        metric(
            cclient, "zhembed_requests_total", route="unmatched", status="404", protocol="http", urgency="3"
        )
        >= 1
    )
    assert (
        delta(
            "duration", "zhembed_request_duration_seconds_count", route="/embed", protocol="http", urgency="3"
        )
        == 3
    )
    assert delta("misses", "zhembed_cache_misses_total", tier="memory") == 3
    assert delta("hits", "zhembed_cache_hits_total", tier="memory") == 3
    assert delta("validation", "zhembed_failures_total", reason="validation") == 1
    assert delta("queued", "zhembed_queue_duration_seconds_count", urgency="3") == 3
    real = 5 + 6 + 7  # characters + [CLS] + [SEP]
    computed = delta("computed", "zhembed_computed_tokens_total")
    assert computed - delta("padding", "zhembed_padding_tokens_total") == real
    assert 1 <= delta("batches", "zhembed_batch_size_count") <= 3
    assert metric(cclient, "zhembed_cache_bytes") == cached.service.cache.memory.bytes > 0  # type: ignore[union-attr]
    depths = samples(cclient, "zhembed_queue_depth")
    assert sorted(dict(labels)["urgency"] for labels in depths) == [str(u) for u in range(8)]  # every one
    assert sum(depths.values()) == 0
    assert metric(cclient, "zhembed_inputs_in_flight") == 0


def test_model_info_names_the_loaded_model(cclient: httpx.Client, cached: Running) -> None:
    (labels,) = samples(cclient, "zhembed_model_info")
    info = dict(labels)
    source = cached.service.model.manifest.source
    assert info == {
        "model": source.name(),  # the served name: the folder's name, never its path
        "variant": "fp32",
        "provider": "CPUExecutionProvider",
        "weights": source.weights,
    }
    assert samples(cclient, "zhembed_model_info")[labels] == 1


@pytest.mark.parametrize("count", [0, 5, 300])  # the bisect branch and the numpy branch
def test_observe_many_counts_as_observing_each_value(count: int) -> None:
    rng = np.random.default_rng(count)
    # Values on the bounds themselves, beyond the last one, and between.
    values = np.concatenate([rng.random(count) * 12, np.asarray(LATENCY_BUCKETS[: min(count, 15)])])
    one, many = Metrics(), Metrics()
    for v in values:
        one.queue_duration.labels("3").observe(float(v))
    observe_many(many.queue_duration.labels("3"), values)

    def series(m: Metrics) -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels.get("le", "")): s.value
            for metric in m.queue_duration.collect()
            for s in metric.samples
            if not s.name.endswith("_created")
        }

    got, want = series(many), series(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def _series(metrics: Metrics) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Each sample name's label sets, as a scrape shows them."""
    out: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).add(tuple(sorted(s.labels.items())))
    return out


def test_a_service_of_one_model_has_no_model_label() -> None:
    metrics = Metrics(models=["only"])
    assert metrics.for_model("only") is metrics
    metrics.batch_assembled(2, 10, 12)
    metrics.request_done("/embed", 200, 0.01, model="only")
    series = _series(metrics)
    assert series["zhembed_batch_size_count"] == {()}
    assert all("model" not in dict(labels) for labels in series["zhembed_requests_total"])


def test_several_models_report_each_under_its_own_label() -> None:
    metrics = Metrics(models=["embed", "rerank"])
    rerank = metrics.for_model("rerank")
    metrics.batch_assembled(4, 30, 40)  # the first model's stages report through the object itself
    rerank.batch_assembled(2, 10, 16)
    rerank.batch_ran(0.01, 0.01, np.array([0.001, 0.002]), [3, 7])
    rerank.tokenized(0.001)
    rerank.cache_lookup("memory", hits=2, misses=1)
    metrics.request_done("/rerank", 200, 0.02, model="rerank")
    metrics.request_done("/embed", 404, 0.001, model="")  # refused before a model was chosen
    rerank.watch_queue(lambda urgency: float(urgency == 7))
    got = _series(metrics)
    assert got["zhembed_batch_size_count"] == {(("model", "embed"),), (("model", "rerank"),)}
    text = metrics.exposition().decode()
    assert 'zhembed_padding_tokens_total{model="rerank"} 6.0' in text
    assert 'zhembed_padding_tokens_total{model="embed"} 10.0' in text
    assert 'zhembed_queue_duration_seconds_count{model="rerank",urgency="7"} 1.0' in text
    assert 'zhembed_cache_hits_total{model="rerank",tier="memory"} 2.0' in text
    assert 'zhembed_cache_hits_total{model="embed",tier="memory"} 0.0' in text  # there from the start
    assert 'zhembed_queue_depth{model="rerank",urgency="7"} 1.0' in text
    assert 'zhembed_tokenization_duration_seconds_count{model="rerank"} 1.0' in text
    assert (
        'zhembed_requests_total{model="rerank",protocol="http",route="/rerank",status="200",urgency="3"} 1.0'
        in text
    )
    assert (
        'zhembed_requests_total{model="",protocol="http",route="/embed",status="404",urgency="3"} 1.0' in text
    )
