"""The tokenizer behind a small interface, read from the model folder's ``tokenizer.json``.

Truncation and padding of the json are switched off: the service needs every input's full token count
(to report it, or to split it into windows) and pads batches itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from app.model.manifest import TokenizerInfo

# encode_batch on one thread, the calling one: by default it fans out over a Rayon pool of a thread per
# core whose threads spin while they wait, and the service batches across requests already. Measured
# (python -m loadtest.overhead --in-process, 2 cores, 8 x 32): the pool burnt ~49 µs of CPU per sentence
# beside the tokenisation thread's 9; encoding on that thread alone costs ~47 in all, and more so where there
# are more cores to spin. Read by tokenizers at each call, before its first parallel one; an operator's
# own TOKENIZERS_PARALLELISM wins.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# What Hugging Face's ``clean_up_tokenization`` does to decoded text; applied when the tokenizer config
# asks for it, so fill-mask sequences read exactly like the transformers pipeline's.
_CLEANUPS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip
# Every character the clean-ups read: a character outside these is never part of a replacement, so the
# text on either side of one cleans up apart (app/tasks/fill_text.py builds on that).
CLEANUP_CHARS = frozenset("".join(old for old, _ in _CLEANUPS))


# One input to encode: a text, or a pair of texts ([CLS] a [SEP] b [SEP], token types 0 then 1).
TextInput = str | tuple[str, str]
TextInputs = Sequence[TextInput]


class TextTokenizer:
    def __init__(self, folder: Path, info: TokenizerInfo) -> None:
        self.info = info
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.no_truncation()
        self._tok.no_padding()
        self.clean_up_spaces = False
        config = folder / "tokenizer_config.json"
        if config.is_file():
            self.clean_up_spaces = bool(json.loads(config.read_text()).get("clean_up_tokenization_spaces"))

    @property
    def max_length(self) -> int:
        """Most tokens the model takes in one sequence, [CLS] and [SEP] included."""
        return self.info.max_length

    def encode_batch(
        self, texts: Sequence[TextInput], add_special_tokens: bool = True, offsets: bool = True
    ) -> list[Encoding]:
        """Encode ``texts`` in one call (the Rust side releases the GIL and may use several threads).

        ``offsets=False`` skips tracking each token's character span (``Encoding.offsets`` are then
        meaningless): 40% less time per text, for callers that only need ids (embeddings, fill-mask).
        """
        if offsets:
            return self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return self._tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    def encode_holding(self, texts: Sequence[TextInput], add_special_tokens: bool = True) -> list[Encoding]:
        """Encode ``texts`` one by one, holding the GIL: the same encodings as :meth:`encode_batch` (offsets
        included), for a few short texts on a thread that must not let go of the GIL. ``encode_batch``
        releases it, and taking it back while other threads run Python waits up to the interpreter's
        switch interval (5 ms) per call, a hundred times what a short text costs to encode.
        """
        encode = self._tok.encode
        return [
            encode(t, add_special_tokens=add_special_tokens)
            if isinstance(t, str)
            else encode(t[0], t[1], add_special_tokens=add_special_tokens)
            for t in texts
        ]

    @property
    def backend(self) -> Tokenizer:
        """The ``tokenizers`` Tokenizer itself (for its vocabulary and decoder: app/tasks/entities.py)."""
        return self._tok

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token`` if it is one entry of the vocabulary (added tokens included), else None."""
        return self._tok.token_to_id(token)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.clean(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def clean(self, text: str) -> str:
        """Decoded ``text`` cleaned up as :meth:`decode` leaves it (when the tokenizer config asks)."""
        if self.clean_up_spaces:
            for old, new in _CLEANUPS:
                text = text.replace(old, new)
        return text
