"""Sparse vectors (SPLADE, ``POST /embed_sparse``, TEI's ``EmbedSparse``): per input a weight for each
vocabulary entry the model's masked-LM head finds in it, the zero weights left out. The export's sparse
graph runs in the encoder's batch, so a [batch, seq, vocab] tensor never leaves ONNX Runtime; the cache
keeps each vector's non-zero entries (a few hundred bytes, not the vocabulary's 84 KB), ``top_k`` after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.work import Need
from app.errors import ServiceError, Unsupported, ValidationFailed
from app.tasks.answers import Answer, Spent, timed
from app.tasks.core import Packing, Task
from app.tasks.options import Direction, LongText, Names, listed
from app.tasks.prepare import TOO_LONG_TRUNCATE, Name, Prepared, Rules, from_encodings, text_problems

# The k largest of many weights (_sampled_largest): one weight in SAMPLE_STRIDE is sampled, and the
# sample's weight ranked SAMPLE_SIGMAS standard deviations (and SAMPLE_MARGIN) past the e of the k largest
# it holds on average (about Poisson(e)) becomes a cut; only the weights at or above it are ranked (about
# 2k of a row, not its ~20,000 non-zeros). Fewer than k of them (in random order, under one row in 10^4
# for any k) only costs the full pass the cut saves. A sparser sample or a looser cut measured slower: the
# pass that picks the weights above the cut costs more the more it picks.
SAMPLE_STRIDE = 8
SAMPLE_SIGMAS = 4.0
SAMPLE_MARGIN = 2


@dataclass(frozen=True)
class SparseVector:
    """One input's non-zero weights: their vocabulary ``indices`` (ascending, int32) and ``values``."""

    indices: np.ndarray
    values: np.ndarray

    @staticmethod
    def of(vector: np.ndarray) -> SparseVector:
        """The non-zero entries of a dense [vocab] vector (gathered by position: on ~20,000 non-zeros a
        quarter of the time of a gather through the mask)."""
        indices = np.flatnonzero(vector != 0)
        return SparseVector(indices.astype(np.int32), vector.take(indices))

    @staticmethod
    def largest(vector: np.ndarray, k: int | None) -> SparseVector:
        """``SparseVector.of(vector).top(k)`` without picking every non-zero of the dense ``vector``."""
        kept = None if k is None else _sampled_largest(vector, k)
        if kept is None:
            return SparseVector.of(vector).top(k)
        return SparseVector(kept.astype(np.int32), vector.take(kept))

    def top(self, k: int | None) -> SparseVector:
        """The ``k`` largest weights (ties: the lower index), still in index order; all with None."""
        if k is None or k >= len(self.values):
            return self
        kept = _sampled_largest(self.values, k)
        if kept is None:
            kept = _largest(self.values, k)
        return SparseVector(self.indices[kept], self.values[kept])


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` largest ``values``, ascending; of ties with the k-th, the lower ones."""
    n = len(values)
    kth = np.partition(values, n - k)[n - k]  # the k-th largest weight: O(n), not a sort
    kept = np.flatnonzero(values >= kth)
    if len(kept) == k:  # the usual case: no other weight ties with the k-th
        return kept
    above = np.flatnonzero(values > kth)
    ties = np.flatnonzero(values == kth)[: k - len(above)]  # ascending: the lower positions
    return np.sort(np.concatenate([above, ties]))


def _sampled_largest(values: np.ndarray, k: int) -> np.ndarray | None:
    """:func:`_largest`'s positions, ranking only the weights at or above a sampled cut; None where the
    cut is not above 0 (weights of 0 are no answer's) or leaves fewer than ``k``."""
    sample = values[::SAMPLE_STRIDE]
    m = len(sample)
    e = k * m / len(values)
    rank = math.ceil(e + SAMPLE_SIGMAS * math.sqrt(e)) + SAMPLE_MARGIN
    if rank >= m:
        return None
    cut = np.partition(sample, m - rank)[m - rank]
    if not cut > 0:
        return None
    candidates = np.flatnonzero(values >= cut)
    if len(candidates) < k:
        return None
    return candidates[_largest(values.take(candidates), k)]  # the k largest are all among them


def top_rows(vectors: np.ndarray, k: int | None) -> list[SparseVector]:
    """Each dense row of ``vectors`` [n, vocab] as ``SparseVector.of(row).top(k)``."""
    return [SparseVector.largest(v, k) for v in vectors]


def pack(vector: np.ndarray) -> np.ndarray:
    """A dense vector as the cache keeps it: its non-zero indices (int32 bytes as float32), their weights."""
    indices = np.flatnonzero(vector != 0)
    n = len(indices)
    packed = np.empty(2 * n, np.float32)
    packed[:n].view(np.int32)[:] = indices
    vector.take(indices, out=packed[n:])
    return packed


def unpack(packed: np.ndarray) -> SparseVector:
    half = len(packed) // 2
    return SparseVector(packed[:half].view(np.int32), packed[half:])


@dataclass(frozen=True)
class SparseRows:
    """The bulk job's answer: the good texts' vectors, their tokens, and each other text's problem."""

    vectors: list[SparseVector]
    tokens: np.ndarray  # int64 [len(vectors)], [CLS] and [SEP] included, before any truncation
    problems: dict[int, ServiceError]


def check_top_k(top_k: int | None) -> None:
    if top_k is not None and top_k < 1:
        raise ValidationFailed(
            f"top_k must be at least 1 (or left out for every non-zero weight), not {top_k}"
        )


class SparseEmbeddings(Task):
    def check(self, long_text: LongText, top_k: int | None) -> None:
        """The checks of a call, in this order, for a request and the bulk job (before any row is read)."""
        self.core.check_ready()
        if not self.core.model.has_sparse:
            raise Unsupported(
                f"this model ({self.core.served_name}) has no sparse (SPLADE) output: export it with "
                "`python -m export --sparse max` (a BERT with a masked-LM head), or serve a sentence-"
                "transformers SparseEncoder folder"
            )
        if long_text == "chunk":  # a sparse vector is one sequence's, not a mean of windows
            raise ValidationFailed(
                "sparse vectors are not averaged over windows: send truncate: true or shorten the text"
            )
        check_top_k(top_k)

    async def _dense(
        self, texts: list[str], rules: Rules, name: Name, spent: Spent, refuse: bool
    ) -> tuple[Prepared, np.ndarray]:
        """How ``texts`` were prepared, and the dense vectors [good texts, vocab]."""
        encodings, took = await self.core.engine.tokenize(texts, offsets=False)
        spent.tokenization_ms += took
        prepared = from_encodings(encodings, rules, name)
        if refuse:
            prepared.refuse()
        if not prepared.ids:  # every text refused (rows only): nothing ran
            return prepared, np.empty((0, 0), np.float32)
        job = await self.core.run(prepared.ids, Need(sparse=True))
        spent.jobs.append(job)
        assert job.vectors is not None
        return prepared, job.vectors[:, 0]

    async def rows(
        self,
        texts: list[str],
        long_text: LongText,
        direction: Direction,
        names: Names,
        too_long: str,
        top_k: int | None = None,
    ) -> SparseRows:
        """Each text's sparse vector, or why it is refused: the bulk job's call (as ``Embeddings.rows``)."""
        self.check(long_text, top_k)
        rules = self.core.rules(too_long, long_text, direction)
        problems = text_problems(texts, self.core.settings.max_input_chars, names.item)
        good = [i for i in range(len(texts)) if i not in problems]
        if not good:
            return SparseRows([], np.empty(0, np.int64), problems)
        with self.core.engine.admit(len(good)):
            prepared, dense = await self._dense(
                [texts[i] for i in good], rules, lambda k: names.item(good[k]), Spent(), refuse=False
            )
        problems.update((good[k], problem) for k, problem in prepared.problems.items())
        return SparseRows(top_rows(dense, top_k), prepared.tokens, dict(sorted(problems.items())))

    @timed
    async def embed_sparse(
        self,
        inputs: str | list[str],
        long_text: LongText = "error",
        direction: Direction = "right",
        top_k: int | None = None,
    ) -> Answer[list[SparseVector]]:
        """Each input's sparse vector, in input order (``top_k``: only its largest weights)."""
        self.check(long_text, top_k)
        rules = self.core.rules(TOO_LONG_TRUNCATE, long_text, direction)
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        spent = Spent()

        async def compute(todo: list[str], first: Callable[[int], int]) -> np.ndarray:
            _, dense = await self._dense(todo, rules, lambda i: names.item(first(i)), spent, refuse=True)
            return dense

        def take(rows: np.ndarray, at: list[int] | None) -> list[SparseVector]:
            # No cache: top_k straight from the dense rows, none of them packed.
            computed = top_rows(rows, top_k)
            return computed if at is None else [computed[k] for k in at]

        sparse = self.core.model.manifest.sparse
        packing = Packing(
            lambda: self.core.key_space(
                pooling=f"splade-{sparse.pooling}-{sparse.activation}" if sparse else "splade",
                long_text=long_text,
                truncation_direction=direction,
                input="text",
                output="sparse",
            ),
            None,  # the cache keeps every non-zero: top_k after it
            lambda rows: [pack(v) for v in rows],
            lambda stored: [unpack(p).top(top_k) for p in stored],
            take,
        )
        vectors = await self.core.cached(texts, compute, packing)
        return Answer(vectors, spent.timings())
