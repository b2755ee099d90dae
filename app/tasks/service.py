"""The service: the shared :class:`~app.tasks.core.Core` with a room per task (``embeddings``, ``fill_mask``,
``heads``, ``tokens``, ``sparse``, ``retrieval``), and the warm-up. It knows nothing of HTTP or gRPC: the
tasks raise :mod:`app.errors`' typed errors and return arrays and plain data with their timings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from app.cache.vectors import VectorCache
from app.engine.engine import Engine
from app.engine.work import Need
from app.errors import InternalError, log_fault
from app.model.runtime import MLM_ROWS, OnnxModel
from app.settings import Settings
from app.tasks.answers import Answer, TokenVectors
from app.tasks.core import Core
from app.tasks.embeddings import Embeddings
from app.tasks.fill_mask import FillMask
from app.tasks.heads import Heads
from app.tasks.options import listed
from app.tasks.prepare import TOO_LONG_EMBED
from app.tasks.retrieval import Retrieval
from app.tasks.sparse import SparseEmbeddings
from app.tasks.tokens import Tokens
from app.telemetry.timings import Timings

__all__ = ["Answer", "Service", "Timings", "TokenVectors", "fault_of"]

# Texts embedded at start-up: short, medium and long Chinese inputs, alone and batched.
_WARMUP_TEXTS = ("你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都。" * 12)


class Service(Core):
    """The shared core and its tasks: one per process."""

    def __init__(self, settings: Settings, model: OnnxModel, engine: Engine, cache: VectorCache) -> None:
        super().__init__(settings, model, engine, cache)
        self.embeddings = Embeddings(self)
        self.fill_mask = FillMask(self)
        self.heads = Heads(self)
        self.tokens = Tokens(self)
        self.sparse = SparseEmbeddings(self)
        self.retrieval = Retrieval(self, self.embeddings, self.heads)
        self.warmup_fault: str | None = None  # why its warm-up failed (:meth:`warmup_failed`)

    @property
    def fault(self) -> str | None:
        """Why this model cannot serve, for good (its warm-up failed, or its inference thread died): 503."""
        return self.warmup_fault or self.engine.inference.fault

    def warmup_failed(self, exc: Exception) -> InternalError:
        """Record that the warm-up failed with ``exc``: logged once, under an error id ``fault`` names."""
        error = exc if isinstance(exc, InternalError) else InternalError(f"{type(exc).__name__}: {exc}")
        log_fault(error, exc)
        self.warmup_fault = f"the warm-up of {self.served_name} failed (error id {error.error_id})"
        return error

    async def warmup(self) -> None:
        """Run inputs of typical shapes, and the largest batches, so the first real request pays no set-up."""
        texts = list(_WARMUP_TEXTS)
        # No more at once than the server admits (a warm-up refused with 429 would never mark it ready).
        room = self.settings.max_concurrent_inputs
        for batch in ([texts[0]], texts[:room], (texts * 3)[:room]):  # past the cache: the model runs
            await self.embeddings.rows(
                batch, replace(self.defaults, long_text="truncate"), listed("inputs", batch), TOO_LONG_EMBED
            )
        info = self.model.manifest.tokenizer
        # The largest batches the limits allow, so that ONNX Runtime's arena holds at ready what the
        # worker will ever need: it keeps the most any batch has needed, and grown by the traffic it
        # would step up for weeks, each time a batch of a new shape did not fit (issue 31).
        need = Need(
            layers=() if self.model.has_head else (self.model.num_layers,),
            pooling=None if self.model.has_head else self.defaults.pooling,
            head=self.model.has_head,
        )
        for size, length in self.engine.limits.largest(self.model.tokenizer.max_length):
            body = np.full(length, info.mask_id, dtype=np.int64)
            body[0], body[-1] = info.cls_id, info.sep_id
            await self.run([body] * size, need)
            if self.model.has_sparse:  # its own graph and arena
                await self.run([body] * size, Need(sparse=True))
        ids = np.array([info.cls_id, info.mask_id, info.sep_id], dtype=np.int64)
        if self.model.has_mlm_head:  # the most rows the head runs at once (MLM_ROWS), for the same reason
            masks = min(MLM_ROWS, self.model.tokenizer.max_length - 2)
            filled = np.array([info.cls_id, *[info.mask_id] * masks, info.sep_id], dtype=np.int64)
            await self.run([filled], [Need(mask_positions=tuple(range(1, masks + 1)))])
        if self.model.has_sparse:  # its own graph, with or without the masked-LM head's
            await self.run([ids], [Need(sparse=True)])


def fault_of(services: Iterable[Service]) -> str | None:
    return next((fault for service in services if (fault := service.fault) is not None), None)
