"""The service called directly (no HTTP): what each endpoint returns, and what it refuses before work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.errors import EmptyInput, NotReady, Overloaded, ValidationFailed
from app.settings import Settings
from app.tasks import tokens
from app.tasks.options import EmbedAllOptions, EmbedOptions
from app.tasks.service import Service
from app.telemetry.metrics import Metrics


@pytest.fixture(scope="module")
def service(tiny_model: Any, tiny_settings: Settings) -> Iterator[Service]:
    settings = tiny_settings.model_copy(update={"max_inputs_per_request": 4})
    metrics = Metrics()
    engine = Engine(tiny_model, settings, metrics)
    engine.start()
    svc = Service(settings, tiny_model, engine, VectorCache(None, None, metrics))
    svc.ready = True
    yield svc
    engine.stop()


def test_embed_returns_unit_float32_vectors_and_stage_timings(service: Service) -> None:
    answer = asyncio.run(service.embeddings.embed(["你好", "北京"], EmbedOptions()))
    assert len(answer.value) == 2
    for v in answer.value:
        assert v.dtype == np.float32 and v.shape == (service.model.hidden_size,)
        assert abs(float(np.linalg.norm(v)) - 1) < 1e-5
    t = answer.timings
    assert t.total_ms >= t.inference_ms > 0 and t.tokenization_ms > 0


def test_concat_doubles_the_width(service: Service) -> None:
    answer = asyncio.run(service.embeddings.embed("你好", EmbedOptions(layers=(1, 3), normalize=False)))
    assert answer.value[0].shape == (2 * service.model.hidden_size,)


def test_refusals_come_before_any_permit_is_taken(service: Service) -> None:
    admission = service.engine.admission
    for call, error in [
        (service.embeddings.embed(["一"] * 5, EmbedOptions()), ValidationFailed),
        (service.embeddings.embed([""], EmbedOptions()), EmptyInput),
        (service.embeddings.embed("一", EmbedOptions(layers=(9,))), ValidationFailed),
        (service.tokens.embed_all("一", EmbedAllOptions(long_text="chunk")), ValidationFailed),
        (
            service.fill_mask.fill("我[MASK]你", 5, ["字" * (service.settings.max_input_chars + 1)]),
            ValidationFailed,
        ),
    ]:
        with pytest.raises(error):
            asyncio.run(call)
        assert admission.in_use == 0


def test_similarity_embeddings_and_tokenize(service: Service) -> None:
    scores = asyncio.run(service.embeddings.similarity("你好", ["你好", "北京"], None, EmbedOptions())).value
    assert abs(scores[0] - 1) < 1e-5 and scores[1] < scores[0]
    vectors, tokens = asyncio.run(service.embeddings.openai(["你好", "北京天安门"], None)).value
    assert len(vectors) == 2 and tokens == 4 + 7  # [CLS] and [SEP] counted
    (tokenized,) = asyncio.run(service.tokens.tokenize("你好", add_special_tokens=False)).value
    assert [t["text"] for t in tokenized] == ["你", "好"]


def test_fill_mask_answers_in_the_pipelines_shapes(service: Service) -> None:
    one = asyncio.run(service.fill_mask.fill("我[MASK]你", 2)).value
    assert len(one) == 2 and all(isinstance(p, dict) for p in one)
    several = asyncio.run(service.fill_mask.fill("[MASK]爱[MASK]", 2)).value
    assert len(several) == 2 and all(len(m) == 2 and isinstance(m[0], dict) for m in several)
    listed = asyncio.run(service.fill_mask.fill(["我[MASK]你"], 2)).value
    assert listed == [one]


def test_fill_mask_targets_stand_for_their_first_token(service: Service) -> None:
    tokenizer = service.model.tokenizer
    answer = asyncio.run(service.fill_mask.fill("我[MASK]你", 5, ["爱", "想念", "爱"])).value
    # 想念 is no token: 想 stands in; 爱 counts once; top_k is capped at the two left.
    assert len(answer) == 2
    assert {p["token"] for p in answer} == {tokenizer.token_to_id("爱"), tokenizer.token_to_id("想")}


def test_an_unready_service_refuses(service: Service) -> None:
    service.ready = False
    try:
        with pytest.raises(NotReady):
            asyncio.run(service.embeddings.embed("你好", EmbedOptions()))
    finally:
        service.ready = True


def test_the_warm_up_runs_the_largest_batches_the_limits_allow(
    tiny_model: Any, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 × 64² of attention: 4 inputs of 64 tokens, or 1 of the model's longest.
    settings = tiny_settings.model_copy(update={"max_batch_size": 4, "max_batch_attention": 4 * 64 * 64})
    shapes: list[tuple[int, int]] = []
    encode = tiny_model.encode

    def recording(input_ids: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        shapes.append(input_ids.shape)
        return encode(input_ids, *args, **kwargs)

    monkeypatch.setattr(tiny_model, "encode", recording)
    metrics = Metrics()
    engine = Engine(tiny_model, settings, metrics)
    engine.start()
    try:
        longest = tiny_model.tokenizer.max_length
        assert engine.limits.largest(longest) == [(4, 64), (1, longest)]
        asyncio.run(Service(settings, tiny_model, engine, VectorCache(None, None, metrics)).warmup())
    finally:
        engine.stop()
    assert (4, 64) in shapes and (1, longest) in shapes
    assert all(size * length * length <= 4 * 64 * 64 for size, length in shapes if size > 1)


def test_decode_takes_a_permit_per_list_before_any_work(service: Service) -> None:
    admission = service.engine.admission
    held = admission.try_acquire(admission.limit - 1)
    try:
        with pytest.raises(Overloaded):
            asyncio.run(service.retrieval.decode([[101], [102]], True))
        assert asyncio.run(service.retrieval.decode([[101, 872, 102]], True)).value == ["你"]
    finally:
        held.release()
    assert admission.in_use == 0


def test_tokenize_holds_its_permits_until_its_table_is_built(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_use: list[int] = []
    built = tokens.token_table

    def table(encodings: list[Any]) -> list[list[dict[str, object]]]:
        in_use.append(service.engine.admission.in_use)
        return built(encodings)

    monkeypatch.setattr(tokens, "token_table", table)
    asyncio.run(service.tokens.tokenize(["你好", "好"], add_special_tokens=False))
    assert in_use == [2]  # as gRPC's Tokenize: the answer in the making is bounded by the budget too
    assert service.engine.admission.in_use == 0


def test_decode_takes_no_more_ids_in_all_than_tokenize_answers(service: Service) -> None:
    settings = service.settings.model_copy(update={"max_tokenize_tokens": 5})
    small = Service(settings, service.model, service.engine, service.cache)
    small.ready = True
    assert asyncio.run(small.retrieval.decode([[101, 872], [872, 102, 102]], True)).value == ["你", "你"]
    with pytest.raises(ValidationFailed, match="6 ids in one request; the limit is 5"):
        asyncio.run(small.retrieval.decode([[101, 872, 102], [872, 102, 102]], True))
