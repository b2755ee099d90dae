"""Sparse vectors (SPLADE, ``POST /embed_sparse``, TEI's ``EmbedSparse``): per input a weight for each
vocabulary entry the model's masked-LM head finds in it, the zero weights left out.

The export's sparse graph computes them (export/graphs.py): the engine runs it on the sequences' last
hidden states in the same batch as the encoder, so a [batch, seq, vocab] tensor never leaves ONNX
Runtime. The cache keeps each vector as its non-zero entries (int32 indices, float32 weights), a few
hundred bytes rather than the vocabulary's 84 KB; ``top_k`` is applied after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.work import Need
from app.errors import ServiceError, Unsupported, ValidationFailed
from app.tasks.answers import Answer, Spent, timed
from app.tasks.core import Core, Packing
from app.tasks.options import Direction, LongText, Names, listed
from app.tasks.prepare import TOO_LONG_TRUNCATE, from_encodings, text_problems

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
    """One input's sparse vector: its non-zero weights' vocabulary ``indices`` (ascending, int32) and
    ``values`` (float32, > 0)."""

    indices: np.ndarray
    values: np.ndarray

    @staticmethod
    def of(vector: np.ndarray) -> SparseVector:
        """The non-zero entries of a dense [vocab] float32 vector: their positions through a boolean mask,
        their weights gathered by position (on a row of ~20,000 non-zeros a quarter of the time of a
        gather through the mask)."""
        indices = np.flatnonzero(vector != 0)
        return SparseVector(indices.astype(np.int32), vector.take(indices))

    @staticmethod
    def largest(vector: np.ndarray, k: int | None) -> SparseVector:
        """``SparseVector.of(vector).top(k)`` (the same entries, ties to the lower index) without picking
        every non-zero of the dense [vocab] float32 ``vector``: see :func:`_sampled_largest` (else it
        falls back on :meth:`of` and :meth:`top`)."""
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
    """The positions of the ``k`` largest of ``values`` (k at most their number), ascending; of weights
    equal to the k-th largest, the lower positions."""
    n = len(values)
    kth = np.partition(values, n - k)[n - k]  # the k-th largest weight: O(n), not a sort
    kept = np.flatnonzero(values >= kth)
    if len(kept) == k:  # the usual case: no other weight ties with the k-th
        return kept
    above = np.flatnonzero(values > kth)
    ties = np.flatnonzero(values == kth)[: k - len(above)]  # ascending: the lower positions
    return np.sort(np.concatenate([above, ties]))


def _sampled_largest(values: np.ndarray, k: int) -> np.ndarray | None:
    """:func:`_largest`'s positions, ranking only the weights at or above a cut sampled from ``values``
    (see SAMPLE_STRIDE); None where the cut is not above 0 (weights of 0 are no answer's) or leaves
    fewer than ``k``."""
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
    """Each dense row of ``vectors`` [n, vocab] as ``SparseVector.of(row).top(k)`` (see
    :meth:`SparseVector.largest`)."""
    if k is None:
        return [SparseVector.of(v) for v in vectors]
    return [SparseVector.largest(v, k) for v in vectors]


def pack(vector: np.ndarray) -> np.ndarray:
    """A dense [vocab] float32 vector as the cache keeps it: its non-zero indices (int32, as float32 bytes)
    then their weights, one float32 array of twice their number, written in place."""
    indices = np.flatnonzero(vector != 0)
    n = len(indices)
    packed = np.empty(2 * n, np.float32)
    packed[:n].view(np.int32)[:] = indices
    vector.take(indices, out=packed[n:])
    return packed


def unpack(packed: np.ndarray) -> SparseVector:
    """:func:`pack`'s array back as a :class:`SparseVector`."""
    half = len(packed) // 2
    return SparseVector(packed[:half].view(np.int32), packed[half:])


@dataclass(frozen=True)
class SparseRows:
    """The bulk job's sparse answer for a call's texts: the vectors of the good ones (in text order), their
    tokens ([CLS] and [SEP] included, before any truncation), and each other text's problem by index."""

    vectors: list[SparseVector]
    tokens: np.ndarray  # int64 [len(vectors)]
    problems: dict[int, ServiceError]


def check_top_k(top_k: int | None) -> None:
    """Raises ValidationFailed for a ``top_k`` under 1."""
    if top_k is not None and top_k < 1:
        raise ValidationFailed(
            f"top_k must be at least 1 (or left out for every non-zero weight), not {top_k}"
        )


class SparseEmbeddings:
    """The sparse-vector task over the shared :class:`~app.tasks.core.Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def check(self) -> None:
        """Raises NotReady while warming up, Unsupported for a model exported without the sparse graph."""
        self.core.check_ready()
        if not self.core.model.has_sparse:
            raise Unsupported(
                f"this model ({self.core.served_name}) has no sparse (SPLADE) output: export it with "
                "`python -m export --sparse max` (a BERT with a masked-LM head), or serve a sentence-"
                "transformers SparseEncoder folder"
            )

    def check_long_text(self, long_text: LongText) -> None:
        """Raises ValidationFailed for "chunk": a sparse vector is one sequence's, not a mean of windows."""
        if long_text == "chunk":
            raise ValidationFailed(
                "sparse vectors are not averaged over windows: send truncate: true or shorten the text"
            )

    async def rows(
        self,
        texts: list[str],
        long_text: LongText,
        direction: Direction,
        names: Names,
        too_long: str,
        top_k: int | None = None,
    ) -> SparseRows:
        """Each text's sparse vector, or why it is refused: the bulk job's call. Nothing is cached; a text
        a request would be refused for is left out and its problem kept, in the words a request gets,
        while the others run: one engine call, whatever is wrong (as ``Embeddings.rows``).

        Raises:
            NotReady, Unsupported, ValidationFailed: see :meth:`check`, :meth:`check_long_text`,
                :func:`check_top_k`.
        """
        self.check()
        self.check_long_text(long_text)
        check_top_k(top_k)
        problems = text_problems(texts, self.core.settings.max_input_chars, names.item)
        good = [i for i in range(len(texts)) if i not in problems]
        if not good:
            return SparseRows([], np.empty(0, np.int64), problems)
        rules = self.core.rules(too_long, long_text, direction)
        with self.core.engine.admit(len(good)):
            encodings, _ = await self.core.tokenize([texts[i] for i in good], offsets=False)
            prepared = from_encodings(encodings, rules, lambda k: names.item(good[k]))
            problems.update((good[k], problem) for k, problem in prepared.problems.items())
            if not prepared.ids:
                return SparseRows([], np.empty(0, np.int64), problems)
            job = await self.core.run(prepared.ids, Need(sparse=True))
        assert job.vectors is not None
        vectors = top_rows(job.vectors[:, 0], top_k)
        return SparseRows(vectors, prepared.tokens.astype(np.int64), dict(sorted(problems.items())))

    @timed
    async def embed_sparse(
        self,
        inputs: str | list[str],
        long_text: LongText = "error",
        direction: Direction = "right",
        top_k: int | None = None,
    ) -> Answer[list[SparseVector]]:
        """Each input's sparse vector, in input order (``top_k``: only its largest weights).

        Raises:
            NotReady, Unsupported: see :meth:`check`.
            EmptyInput, ValidationFailed: no inputs, an empty one, one over the model's length (without
                ``long_text`` "truncate"), too many, a ``top_k`` under 1.
        """
        self.check()
        check_top_k(top_k)
        self.check_long_text(long_text)
        names = listed("inputs", inputs)
        texts = self.core.texts(inputs, names)
        rules = self.core.rules(TOO_LONG_TRUNCATE, long_text, direction)
        spent = Spent()

        async def dense(todo: list[str], first: Callable[[int], int]) -> np.ndarray:
            """The dense vectors [len(todo), vocab] of distinct texts."""
            encodings, took = await self.core.tokenize(todo, offsets=False)
            spent.tokenization_ms += took
            prepared = from_encodings(encodings, rules, lambda i: names.item(first(i)))
            prepared.refuse()
            job = await self.core.run(prepared.ids, Need(sparse=True))
            spent.jobs.append(job)
            assert job.vectors is not None
            return job.vectors[:, 0]

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
        vectors = await self.core.cached(texts, dense, packing)
        return Answer(vectors, spent.timings())
