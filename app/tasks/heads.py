"""The fine-tuned heads, each answered as its reference does (transformers' pipelines, sentence-transformers'
``CrossEncoder``): a sequence classifier's labels (``/predict``), a cross-encoder's ranking (``/rerank``), a
token classifier's entities (``/token-classification``). The head runs inside the encoder graph."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from app.engine.postprocess import head_scores
from app.engine.work import Need
from app.errors import InternalError
from app.model.tokenizer import TextInput
from app.tasks import entities
from app.tasks.answers import Answer, Spent, timed, timings_of
from app.tasks.core import Core, Packing, Task, taken
from app.tasks.options import Direction, LongText, Names, listed
from app.tasks.prepare import TOO_LONG_TRUNCATE, check_some, from_encodings
from app.telemetry.timings import Timings


class Heads(Task):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        # A tagger's vocabulary, for the words its entities are made of (transformers' decoding).
        self.vocabulary = entities.vocabulary(core.model.tokenizer.backend) if core.kind == "tagger" else None

    @timed
    async def predict(
        self, inputs: list[TextInput], raw_scores: bool, long_text: LongText, direction: Direction
    ) -> Answer[list[list[dict[str, Any]]]]:
        """Per input (a text or a pair), every label with its score, best first, as transformers'
        ``pipeline("text-classification", top_k=None)`` answers (``raw_scores``: the logits)."""
        head = self.core.head("/predict", "classifier", "reranker")
        # A pair's texts are both named as its input, inputs[i]; the count is of inputs, not of texts.
        self.core.texts([x if isinstance(x, str) else x[0] for x in inputs], listed("inputs", inputs))
        owners = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
        if owners:
            self.core.texts([inputs[i][1] for i in owners], Names("inputs", lambda k: f"inputs[{owners[k]}]"))
        logits, timings = await self._logits(inputs, long_text, direction)
        scores = logits if raw_scores else head_scores(logits, head.activation)
        labels = head.labels
        answer = []
        for row in scores:
            order = np.argsort(-row, kind="stable")
            answer.append(
                [{"score": float(row[k]), "label": labels.get(int(k), f"LABEL_{k}")} for k in order]
            )
        return Answer(answer, timings)

    @timed
    async def rerank(
        self,
        query: str,
        texts: list[str],
        raw_scores: bool,
        return_text: bool,
        long_text: LongText,
        direction: Direction,
    ) -> Answer[list[dict[str, Any]]]:
        """Each text's relevance to ``query``, best first (``index``: its place in ``texts``), as
        sentence-transformers' ``CrossEncoder.predict`` scores the pair (query, text)."""
        head = self.core.head("/rerank", "reranker")
        check_some(len(texts), "texts", "text to rank")
        self.core.texts([query], Names("query", lambda _i: "query"))
        self.core.texts(texts, listed("texts", texts))
        logits, timings = await self._logits([(query, t) for t in texts], long_text, direction, "texts")
        scores = (logits if raw_scores else head_scores(logits, head.activation))[:, 0]
        order = np.argsort(-scores, kind="stable")
        ranks = []
        for k in order.tolist():
            rank: dict[str, Any] = {"index": k, "score": float(scores[k])}
            if return_text:
                rank["text"] = texts[k]
            ranks.append(rank)
        return Answer(ranks, timings)

    @timed
    async def token_classification(
        self,
        inputs: str | list[str],
        strategy: entities.AggregationStrategy,
        ignore_labels: list[str],
        long_text: LongText,
        direction: Direction,
    ) -> Answer[list[Any]]:
        """The entities of each input, as transformers' ``pipeline("token-classification")`` answers with
        ``aggregation_strategy``: a string's answer alone, a list's one answer per input."""
        head = self.core.head("/token-classification", "tagger")
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        rules = self.core.rules(TOO_LONG_TRUNCATE, long_text, direction)
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.engine.tokenize(texts)
            prepared = from_encodings(encodings, rules, names.item)
            prepared.refuse()
            kept = [prepared.positions(k) for k in range(len(texts))]
            job = await self.core.run(prepared.ids, Need(head=True))

        def found() -> list[Any]:  # each input's entities from its kept tokens' logits
            answer = []
            for text, enc, k, states in zip(texts, encodings, kept, job.token_states, strict=True):
                if states is None:
                    raise InternalError("a tagger job came back without its token logits")
                # Each Encoding property builds a new list on access: read each once (not once per token).
                ids, offsets, special = enc.ids, enc.offsets, enc.special_tokens_mask
                answer.append(
                    entities.entities(
                        text,
                        [ids[j] for j in k],
                        [offsets[j] for j in k],
                        [special[j] for j in k],
                        head_scores(states[0], "softmax").astype(np.float32),
                        head.labels,
                        cast(entities.Vocabulary, self.vocabulary),
                        strategy,
                        ignore_labels,
                    )
                )
            return answer

        # Off the event loop: up to 64 × 512 tokens aggregated in Python (transformers' pipeline's way).
        answer = await asyncio.to_thread(found)
        return Answer(answer[0] if isinstance(inputs, str) else answer, timings_of([job], tokenization_ms))

    async def _logits(
        self, inputs: list[TextInput], long_text: LongText, direction: Direction, field_name: str = "inputs"
    ) -> tuple[np.ndarray, Timings]:
        """The head's logits [inputs, labels] of texts and pairs, through the cache when there is one."""
        # Each input's cache key is its JSON: a text's a JSON string, a pair's a JSON array, never the same.
        keys = [json.dumps(x, ensure_ascii=False) for x in inputs]
        item = dict(zip(keys, inputs, strict=True))
        # The head routes run an input the tokenizer leaves nothing of, as transformers' pipelines do.
        rules = self.core.rules(TOO_LONG_TRUNCATE, long_text, direction, refuse_empty=False)
        spent = Spent()

        async def compute(todo: list[str], first: Callable[[int], int]) -> np.ndarray:
            todo_inputs = [item[k] for k in todo]
            encodings, took = await self.core.engine.tokenize(todo_inputs, offsets=False)
            spent.tokenization_ms += took
            pairs = [not isinstance(x, str) for x in todo_inputs]
            prepared = from_encodings(encodings, rules, lambda k: f"{field_name}[{first(k)}]", pairs)
            prepared.refuse()
            job = await self.core.run(prepared.ids, Need(head=True), prepared.types)
            spent.jobs.append(job)
            if job.vectors is None:
                raise InternalError("a /predict job came back without its logits")
            return job.vectors[:, 0, :]

        space = dict(long_text=long_text, truncation_direction=direction, input="json", output="head_logits")
        head = self.core.model.manifest.head
        width = len(head.labels) if head else None
        packing = Packing(lambda: self.core.key_space(**space), width, np.asarray, np.stack, taken)
        return await self.core.cached(keys, compute, packing), spent.timings()
