"""What a fine-tuned checkpoint is served as, for the manifest: its kind (embedding, classifier, reranker,
tagger) and its head (labels, and the function that turns logits into scores, chosen as the libraries the
checkpoint was trained for choose it). Which architectures are served at all is the source's business
(``export.source.HEADS``).
"""

from __future__ import annotations

from transformers import BertConfig

from app.model.manifest import Head, Kind
from export.source import ExportError


def kind(architecture: str | None, config: BertConfig) -> Kind:
    """What the manifest says the model is, from its head's architecture (None: an encoder)."""
    if architecture == "BertForTokenClassification":
        return "tagger"
    if architecture == "BertForSequenceClassification":
        return "reranker" if config.num_labels == 1 else "classifier"
    return "embedding"


# sentence-transformers' CrossEncoder names its activation in config.json ("sentence_transformers").
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
}


def head(architecture: str | None, cfg: BertConfig) -> Head | None:
    """The head's labels and how its scores are made: as transformers' text-classification pipeline does
    (sigmoid for one label or multi-label, none for regression, else softmax), or a cross-encoder's own
    activation (sentence-transformers' CrossEncoder: sigmoid unless the config names another); None for
    an encoder.

    Raises:
        ExportError: a cross-encoder activation that is not served (named).
    """
    if architecture is None:
        return None
    problem = cfg.problem_type
    activation = "softmax"
    if architecture == "BertForSequenceClassification":
        if cfg.num_labels == 1:
            st_config = getattr(cfg, "sentence_transformers", None) or {}
            name = st_config.get("activation_fn", "torch.nn.modules.activation.Sigmoid")
            if name not in CROSS_ENCODER_ACTIVATIONS:
                raise ExportError(
                    f"cross-encoder activation {name!r} cannot be served (served: "
                    f"{', '.join(CROSS_ENCODER_ACTIVATIONS)})"
                )
            activation = CROSS_ENCODER_ACTIVATIONS[name]
        elif problem == "multi_label_classification":
            activation = "sigmoid"
        elif problem == "regression":
            activation = "identity"
    return Head(
        architecture=architecture,
        labels={int(k): str(v) for k, v in (cfg.id2label or {}).items()},
        problem_type=problem,
        activation=activation,  # type: ignore[arg-type]
    )
