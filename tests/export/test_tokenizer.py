"""The serving tokenizer (`tokenizers` on the exported tokenizer.json) equals transformers' BertTokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import BertTokenizer

from app.model.manifest import load_manifest

TEXTS = [
    "中国的首都是北京。",
    "苹果iPhone 15 Pro Max售价9999元，比去年贵了10%。",
    "ＡＢＣ全角字母，１２３全角数字！？（括号）【方括号】",
    "長江是中國最長的河流，臺灣有許多美麗的風景。",
    "今天很开心😊🎉，明天见👋",
    "Transformers库支持BERT、GPT-2和T5等模型；unbelievable tokenization.",
    "电话：010-12345678，邮箱：test@example.com",
    "   前后有空格   ",
    "[MASK]是一种水果。",
]


@pytest.fixture(scope="module")
def serving(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> BertTokenizer:
    # The slow, pure-Python tokenizer from the exported vocab.txt: an independent implementation.
    return BertTokenizer(str(tiny_model_dir / "vocab.txt"), do_lower_case=False)


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_as_bert_tokenizer(serving: Tokenizer, reference: BertTokenizer, text: str) -> None:
    assert serving.encode(text).ids == reference.encode(text)


def test_special_token_ids_are_bert_base_chinese(serving: Tokenizer, tiny_model_dir: Path) -> None:
    info = load_manifest(tiny_model_dir).tokenizer
    assert (info.cls_id, info.sep_id, info.mask_id, info.pad_id) == (101, 102, 103, 0)
    assert serving.token_to_id("中") == 704
    assert serving.encode("中").ids == [101, 704, 102]


def test_offsets_map_back_to_the_text(serving: Tokenizer) -> None:
    text = "苹果iPhone 15售价"
    enc = serving.encode(text)
    pieces = [
        text[a:b] for (a, b), special in zip(enc.offsets, enc.special_tokens_mask, strict=True) if not special
    ]
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
