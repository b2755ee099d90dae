"""Embeddings with a model's prompts, the service called directly: truncation keeps the prompt whichever end
it cuts, and the vector is that of ``[CLS] prompt … tail [SEP]`` run through the model directly; a prompt
that leaves no room for the text is refused."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.errors import ValidationFailed
from app.model.manifest import LAST_HIDDEN_STATE, MANIFEST_NAME
from app.model.runtime import OnnxModel, load_model
from app.settings import Settings
from app.tasks.options import Direction, EmbedOptions, LongText
from app.tasks.service import Service
from app.telemetry.metrics import Metrics

PROMPT = "为这个句子生成表示以用于检索："
TEXT = (
    "长城是中国古代的军事防御工程，" * 12
)  # 180 characters: over the tiny model's 128 tokens with the prompt


def prompted_export(source: Path, folder: Path, prompts: dict[str, str], include_prompt: bool) -> Path:
    """A copy of the export ``source`` whose serving defaults have ``prompts`` (as a sentence-transformers
    folder's would), pooled with the text or not."""
    copy = Path(shutil.copytree(source, folder))
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["defaults"].update(prompts=prompts, include_prompt=include_prompt)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    return copy


@pytest.fixture(scope="module", params=[False, True], ids=["prompt-not-pooled", "prompt-pooled"])
def prompted(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, bool]]:
    include_prompt: bool = request.param
    folder = tmp_path_factory.mktemp("prompted") / "model"
    # "long": a prompt that leaves the text one token of the 128 ([CLS] + 125 + 1 + [SEP]).
    prompts = {"query": PROMPT, "long": "字" * 125, "too_long": "字" * 126}
    settings = Settings(
        model=str(prompted_export(tiny_model_dir, folder, prompts, include_prompt)),
        variant="fp32",
        intra_op_threads=1,
        cache_bytes=0,
        warmup=False,
    )
    metrics = Metrics()
    model = load_model(settings)
    engine = Engine(model, settings, metrics)
    engine.start()
    service = Service(settings, model, engine, VectorCache(None, None, metrics))
    service.ready = True
    yield service, include_prompt
    engine.stop()


def reference(
    model: OnnxModel, prompt: str, text: str, direction: Direction, include_prompt: bool
) -> np.ndarray:
    """The mean-pooled vector of ``[CLS] prompt … [SEP]`` cut to the model's length at ``direction``'s end
    of the text, the prompt kept: the same ids through the model directly, pooled in numpy."""
    (joint,) = model.tokenizer.encode_batch([prompt + text], offsets=False)
    (alone,) = model.tokenizer.encode_batch([prompt], offsets=False)
    ids = np.asarray(joint.ids, np.int64)
    head = len(alone.ids) - 1  # [CLS] and the prompt's tokens, as sentence-transformers counts them
    room = model.tokenizer.max_length - head - 1
    body = ids[head:-1]
    kept = body[:room] if direction == "right" else body[len(body) - room :]
    run = np.concatenate([ids[:head], kept, ids[-1:]])
    assert len(run) == model.tokenizer.max_length and run[-1] == ids[-1]
    (hidden,) = model.encode(run[None, :], np.ones((1, len(run)), np.int64), [LAST_HIDDEN_STATE])
    return hidden[0, 0 if include_prompt else head :].astype(np.float64).mean(axis=0)


@pytest.mark.parametrize("direction", ["left", "right"])
def test_truncation_keeps_the_prompt_and_equals_the_reference(
    prompted: tuple[Service, bool], direction: Direction
) -> None:
    service, include_prompt = prompted
    options = EmbedOptions(
        prompt_name="query",
        long_text="truncate",
        truncation_direction=direction,
        normalize=False,
    )
    (got,) = asyncio.run(service.embeddings.embed(TEXT, options)).value
    expected = reference(service.model, PROMPT, TEXT, direction, include_prompt)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_prompt_that_leaves_one_token_of_the_text_keeps_it(prompted: tuple[Service, bool]) -> None:
    service, include_prompt = prompted
    options = EmbedOptions(
        prompt_name="long", long_text="truncate", truncation_direction="left", normalize=False
    )
    (got,) = asyncio.run(service.embeddings.embed(TEXT, options)).value
    expected = reference(service.model, "字" * 125, TEXT, "left", include_prompt)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_prompt_that_leaves_no_room_for_the_text_is_refused(prompted: tuple[Service, bool]) -> None:
    service, _ = prompted
    modes: tuple[LongText, ...] = ("truncate", "error")
    for long_text in modes:
        options = EmbedOptions(prompt_name="too_long", long_text=long_text, truncation_direction="left")
        with pytest.raises(
            ValidationFailed, match=r"prompt_name 'too_long': its prompt takes 126 tokens.*limit of 128"
        ):
            asyncio.run(service.embeddings.embed("短", options))
    assert service.engine.admission.in_use == 0
