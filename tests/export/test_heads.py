"""What a fine-tuned head is served as: the manifest's kind, and how its scores are made."""

from __future__ import annotations

import pytest
from transformers import BertConfig

from export import heads
from export.source import ExportError

SEQ, TOKEN = "BertForSequenceClassification", "BertForTokenClassification"


def _config(num_labels: int, **extra: object) -> BertConfig:
    return BertConfig(num_labels=num_labels, id2label={i: f"L{i}" for i in range(num_labels)}, **extra)


@pytest.mark.parametrize(
    ("architecture", "labels", "kind"),
    [(None, 2, "embedding"), (TOKEN, 5, "tagger"), (SEQ, 1, "reranker"), (SEQ, 3, "classifier")],
)
def test_the_kind_follows_the_head(architecture: str | None, labels: int, kind: str) -> None:
    assert heads.kind(architecture, _config(labels)) == kind


@pytest.mark.parametrize(
    ("architecture", "config", "activation"),
    [
        (SEQ, _config(3), "softmax"),
        (SEQ, _config(3, problem_type="multi_label_classification"), "sigmoid"),
        (SEQ, _config(2, problem_type="regression"), "identity"),
        (SEQ, _config(1), "sigmoid"),  # a cross-encoder, as sentence-transformers' CrossEncoder scores it
        (
            SEQ,
            _config(1, sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity"}),
            "identity",
        ),
        (TOKEN, _config(4), "softmax"),
    ],
)
def test_scores_are_made_as_the_checkpoints_library_makes_them(
    architecture: str, config: BertConfig, activation: str
) -> None:
    head = heads.head(architecture, config)
    assert head is not None and head.activation == activation and head.architecture == architecture
    assert head.labels == {i: f"L{i}" for i in range(config.num_labels)}


def test_an_encoder_has_no_head() -> None:
    assert heads.head(None, _config(2)) is None


def test_an_unserved_cross_encoder_activation_is_refused_naming_it() -> None:
    config = _config(1, sentence_transformers={"activation_fn": "torch.nn.modules.activation.Tanh"})
    with pytest.raises(
        ExportError, match=r"activation 'torch\.nn\.modules\.activation\.Tanh' cannot be served"
    ):
        heads.head(SEQ, config)
