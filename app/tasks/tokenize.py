"""Tokenize: each input's tokens with their ids, text and character offsets (``/tokenize``, TEI's
``Tokenize``)."""

from __future__ import annotations

from typing import Any

from app.tasks import token_rows
from app.tasks.answers import Answer, timed
from app.tasks.core import Core
from app.tasks.options import listed
from app.telemetry.timings import Timings


class Tokens:
    """The tokenize task over the shared :class:`~app.tasks.core.Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    @timed
    async def tokenize(self, inputs: str | list[str], add_special_tokens: bool) -> Answer[list[Any]]:
        """Tokens with ids, text and character offsets, per input."""
        self.core.check_ready()
        texts = self.core.texts(inputs, listed("inputs", inputs))
        with self.core.engine.admit(len(texts)):
            encodings, tokenization_ms = await self.core.tokenize(texts, add_special_tokens)
        return Answer(token_rows.token_table(encodings), Timings(tokenization_ms=tokenization_ms))
