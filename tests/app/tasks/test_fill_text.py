"""Fill-mask's sequence texts from the input's pieces: byte for byte what decoding each candidate gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.tasks.fill_text import MaskTexts, WholeDecodes, mask_texts

# Texts whose decoded forms the clean-up changes (" .", " ' ", " n't", " 's", …), words cut into ## pieces,
# digits and Latin beside Chinese; each gets a [MASK] at several places.
TEXTS = [
    "北京是中国的首都。",
    "it ' s john ' s , isn ' t it ? yes ! i ' m here .",
    "playing 2023 年 hello world 's end , do not go .",
    "。",
]


def candidates(tokenizer: Any) -> list[int]:
    """Every special token, the tokens the clean-up reads, ## pieces, and a spread of the vocabulary."""
    backend = tokenizer.backend
    spread = list(range(0, backend.get_vocab_size(), 97))
    reads = [backend.token_to_id(t) for t in [".", "?", "!", ",", "'", "n", "t", "s", "m", "ve", "re"]]
    pieces = [backend.token_to_id(t) for t in ["##s", "##ing", "##t", "##'"]]
    specials = list(backend.get_added_tokens_decoder())
    return sorted({t for t in [*specials, *reads, *pieces, *spread] if t is not None})


@pytest.mark.parametrize("clean_up", [True, False])
@pytest.mark.parametrize("skip_special", [True, False])
def test_filled_texts_are_the_whole_decodes(
    tiny_model: Any, skip_special: bool, clean_up: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tiny_model.tokenizer
    monkeypatch.setattr(tokenizer, "clean_up_spaces", clean_up)  # bert-base-chinese's config: True
    mask = tiny_model.manifest.tokenizer.mask_id
    tokens = candidates(tokenizer)
    assert MaskTexts.fits(tokenizer)
    pieces, whole = MaskTexts(tokenizer, skip_special), WholeDecodes(tokenizer, skip_special)
    for text in TEXTS:
        (enc,) = tokenizer.encode_batch([text], offsets=False)
        for position in sorted({1, 2, len(enc.ids) // 2, len(enc.ids) - 2}):
            ids = np.asarray(enc.ids)
            ids[position] = mask
            if position > 1:
                ids[position - 1] = mask  # another mask beside it, visible with skip_special False
            assert pieces.filled(ids.tolist(), position, tokens) == whole.filled(
                ids.tolist(), position, tokens
            ), (
                text,
                position,
            )


def test_a_decoder_that_does_not_write_tokens_apart_decodes_each_candidate(tiny_model: Any) -> None:
    from tokenizers import Tokenizer, decoders

    backend = Tokenizer.from_str(tiny_model.tokenizer.backend.to_str())
    backend.decoder = decoders.Metaspace()

    class Other:
        def __init__(self) -> None:
            self.backend = backend

    assert not MaskTexts.fits(Other())  # type: ignore[arg-type]
    assert isinstance(mask_texts(tiny_model.tokenizer, True), MaskTexts)
