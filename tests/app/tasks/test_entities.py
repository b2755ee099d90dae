"""Named entities against transformers' token-classification pipeline: every aggregation strategy, on a
tiny BertForTokenClassification with the real bert-base-chinese vocab, with its own predictions and with
hand-made ones."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import BertConfig, BertForTokenClassification, BertTokenizerFast, pipeline
from transformers.modeling_outputs import TokenClassifierOutput

from app.errors import ValidationFailed
from app.tasks.entities import STRATEGIES, AggregationStrategy, Vocabulary, entities, vocabulary
from export.source import bert_base_chinese_vocab, write_source_folder

# Two labels outside B-/I-: MISC continues like I-MISC; S-ORG is its own type but its groups are named ORG.
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "MISC", "S-ORG"]

CONFIG: dict[str, object] = {
    "architectures": ["BertForTokenClassification"],
    "model_type": "bert",
    "vocab_size": 21128,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "pad_token_id": 0,
    "id2label": dict(enumerate(LABELS)),
    "label2id": {label: i for i, label in enumerate(LABELS)},
}

TEXTS = [
    "我叫王小明，住在北京市海淀区。",
    "Apple公司在2024年发布了iPhone 16 Pro。",  # cased vocab: Apple and iPhone are [UNK]; 2024 is 202 ##4
    "我爱😀和ab😀cd，还有𠀾字",  # [UNK] for one character and for a whole word around one
    "unbelievable tokenization",  # u ##n ##bel ##ie ##va ##ble, to ##ken ##i ##za ##tion
    "hello ab\u200bcd café",  # the zero-width space is dropped: "abc" covers 4 characters, so is a subword
    "e\u0301te [SEP] x",  # a combining accent inside an [UNK]; [SEP] typed in the text
]


@dataclass
class Ner:
    folder: Path
    model: BertForTokenClassification
    pipe: Any
    tokenizer: Tokenizer
    vocab: Vocabulary
    id2label: dict[int, str]


@pytest.fixture(scope="module")
def ner(tmp_path_factory: pytest.TempPathFactory) -> Ner:
    folder = write_source_folder(tmp_path_factory.mktemp("ner"), CONFIG, bert_base_chinese_vocab())
    torch.manual_seed(11)
    model = BertForTokenClassification(BertConfig.from_pretrained(folder)).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(25)  # confident, varied predictions instead of near-uniform ones
    model.save_pretrained(folder)
    BertTokenizerFast.from_pretrained(folder).save_pretrained(folder)
    assert (folder / "tokenizer.json").is_file()
    model = BertForTokenClassification.from_pretrained(folder).eval()
    fast = BertTokenizerFast.from_pretrained(folder)
    pipe = pipeline("token-classification", model=model, tokenizer=fast, device="cpu")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    id2label = {int(i): label for i, label in model.config.id2label.items()}
    return Ner(folder, model, pipe, tokenizer, vocabulary(tokenizer), id2label)


def softmax(logits: np.ndarray) -> np.ndarray:
    """The pipeline's softmax, step for step."""
    shifted = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def ours(
    ner: Ner, text: str, logits: np.ndarray, strategy: AggregationStrategy, ignore: tuple[str, ...] = ("O",)
) -> list[dict[str, Any]]:
    enc = ner.tokenizer.encode(text)
    return entities(
        text,
        enc.ids,
        enc.offsets,
        enc.special_tokens_mask,
        softmax(logits),
        ner.id2label,
        ner.vocab,
        strategy=strategy,
        ignore_labels=ignore,
    )


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want), (got, want)
    for mine, theirs in zip(got, want, strict=True):
        assert list(mine) == list(theirs)
        assert type(mine["score"]) is float
        assert mine["score"] == pytest.approx(float(theirs["score"]), abs=1e-5)
        assert {k: v for k, v in mine.items() if k != "score"} == {
            k: (int(v) if k in ("start", "end", "index") else v) for k, v in theirs.items() if k != "score"
        }


def model_logits(ner: Ner, text: str) -> np.ndarray:
    ids = torch.tensor([ner.tokenizer.encode(text).ids])
    with torch.no_grad():
        return ner.model(input_ids=ids).logits[0].numpy()


@pytest.mark.parametrize("text", TEXTS)
def test_the_service_tokenizes_as_the_pipeline(ner: Ner, text: str) -> None:
    enc = ner.tokenizer.encode(text)
    theirs = ner.pipe.tokenizer(text, return_special_tokens_mask=True, return_offsets_mapping=True)
    assert enc.ids == theirs["input_ids"]
    assert enc.offsets == [tuple(o) for o in theirs["offset_mapping"]]
    assert enc.special_tokens_mask == theirs["special_tokens_mask"]


def test_the_vocabulary_reads_tokens_as_the_fast_tokenizer(ner: Ner) -> None:
    fast = ner.pipe.tokenizer
    assert ner.vocab.continuing_subword_prefix == "##"
    assert ner.vocab.unk_token_id == fast.unk_token_id == 100
    assert ner.vocab.id_to_token(10**6) is None
    for text in TEXTS:
        enc = ner.tokenizer.encode(text)
        assert [ner.vocab.id_to_token(i) for i in enc.ids] == fast.convert_ids_to_tokens(enc.ids)
        for tokens in (enc.tokens, enc.tokens[1:-1], enc.tokens[2:4], [*enc.tokens[1:3], "##s", "。", "a"]):
            assert ner.vocab.tokens_to_string(tokens) == fast.convert_tokens_to_string(tokens)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("text", TEXTS)
def test_the_models_predictions_give_the_pipelines_entities(ner: Ner, text: str, strategy: Any) -> None:
    want = ner.pipe(text, aggregation_strategy=strategy)
    assert_same(ours(ner, text, model_logits(ner, text), strategy), want)


@contextmanager
def forced(model: BertForTokenClassification, logits: np.ndarray) -> Iterator[None]:
    """The model answers ``logits`` (one row per token) whatever it is asked."""

    def forward(input_ids: torch.Tensor, **_: Any) -> TokenClassifierOutput:
        assert input_ids.shape == (1, len(logits))
        return TokenClassifierOutput(logits=torch.from_numpy(logits)[None])  # type: ignore[arg-type]

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def made_up(n: int, seed: int) -> np.ndarray:
    """Confident random logits for ``n`` tokens, some tied (all labels equal), some sure of one label."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, size=(n, len(LABELS))).astype(np.float32)
    logits[rng.random(n) < 0.1] = 0.0
    for i in np.flatnonzero(rng.random(n) < 0.3):
        logits[i, int(rng.integers(1, len(LABELS)))] += 8.0
    return logits


@pytest.mark.parametrize("ignore", [("O",), (), ("O", "MISC", "ORG")])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_made_up_predictions_give_the_pipelines_entities(
    ner: Ner, strategy: Any, ignore: tuple[str, ...]
) -> None:
    for seed in range(8):
        for text in TEXTS:
            logits = made_up(len(ner.tokenizer.encode(text).ids), seed)
            with forced(ner.model, logits):
                want = ner.pipe(text, aggregation_strategy=strategy, ignore_labels=list(ignore))
            assert_same(ours(ner, text, logits, strategy, ignore), want)


def one_hot(ner: Ner, text: str, labels: dict[int, str]) -> np.ndarray:
    """Logits that pick ``labels[i]`` for token i and O elsewhere, with scores near 1."""
    n = len(ner.tokenizer.encode(text).ids)
    logits = np.zeros((n, len(LABELS)), dtype=np.float32)
    for i in range(n):
        logits[i, LABELS.index(labels.get(i, "O"))] = 10.0
    return logits


def test_groups_read_as_the_decoder_writes_them(ner: Ner) -> None:
    text = TEXTS[0]  # [CLS] 我 叫 王 小 明 ， 住 在 北 京 市 海 淀 区 。 [SEP]
    logits = one_hot(ner, text, {3: "B-PER", 4: "I-PER", 5: "I-PER", 9: "B-LOC", 10: "I-LOC", 11: "B-LOC"})
    got = ours(ner, text, logits, "simple")
    assert [(g["entity_group"], g["word"], g["start"], g["end"]) for g in got] == [
        ("PER", "王 小 明", 2, 5),
        ("LOC", "北 京", 8, 10),
        ("LOC", "市", 10, 11),
    ]
    with forced(ner.model, logits):
        assert_same(got, ner.pipe(text, aggregation_strategy="simple"))


def test_unk_takes_its_text_and_a_shortened_token_joins_the_word_before(ner: Ner) -> None:
    text = TEXTS[4]  # [CLS] hello abc ##d [UNK] [SEP]: "abc" covers "ab\u200bc"; [UNK] covers "café"
    logits = one_hot(ner, text, {1: "B-ORG", 2: "I-PER", 3: "I-PER", 4: "MISC"})
    assert [(g["entity"], g["word"], g["start"], g["end"]) for g in ours(ner, text, logits, "none")] == [
        ("B-ORG", "hello", 0, 5),
        ("I-PER", "abc", 6, 10),
        ("I-PER", "##d", 10, 11),
        ("MISC", "café", 12, 16),
    ]
    assert [(g["entity_group"], g["word"]) for g in ours(ner, text, logits, "first")] == [
        ("ORG", "hello abcd"),
        ("MISC", "café"),
    ]
    with forced(ner.model, logits):
        assert_same(ours(ner, text, logits, "first"), ner.pipe(text, aggregation_strategy="first"))


def test_max_keeps_the_first_of_equally_sure_subwords(ner: Ner) -> None:
    text = TEXTS[3]  # [CLS] u ##n ##bel ##ie ##va ##ble to ##ken ##i ##za ##tion [SEP]
    logits = np.zeros((13, len(LABELS)), dtype=np.float32)  # ties everywhere else: O at 1/9
    for i, label in {3: "B-LOC", 5: "B-PER", 8: "I-ORG", 10: "MISC"}.items():
        logits[i, LABELS.index(label)] = 10.0
    got = ours(ner, text, logits, "max")
    assert [(g["entity_group"], g["word"], g["start"], g["end"]) for g in got] == [
        ("LOC", "unbelievable", 0, 12),
        ("ORG", "tokenization", 13, 25),
    ]
    with forced(ner.model, logits):
        assert_same(got, ner.pipe(text, aggregation_strategy="max"))


def test_without_a_subword_prefix_the_pipelines_heuristic_decides(ner: Ner) -> None:
    fast = BertTokenizerFast.from_pretrained(ner.folder)
    fast.backend_tokenizer.model.continuing_subword_prefix = ""  # pieces without ##: "u", "nb", "el", ...
    pipe = pipeline("token-classification", model=ner.model, tokenizer=fast, device="cpu")
    vocab = vocabulary(fast.backend_tokenizer)
    assert vocab.continuing_subword_prefix is None
    for strategy in STRATEGIES:
        for seed, text in enumerate(TEXTS):
            enc = fast.backend_tokenizer.encode(text)
            logits = made_up(len(enc.ids), seed)
            with forced(ner.model, logits), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Tokenizer does not support real words")
                want = pipe(text, aggregation_strategy=strategy)
            got = entities(
                text,
                enc.ids,
                enc.offsets,
                enc.special_tokens_mask,
                softmax(logits),
                ner.id2label,
                vocab,
                strategy,
            )
            assert_same(got, want)


def test_an_unknown_strategy_is_refused(ner: Ner) -> None:
    text = TEXTS[0]
    with pytest.raises(ValidationFailed, match="aggregation_strategy"):
        ours(ner, text, model_logits(ner, text), "longest")  # type: ignore[arg-type]
