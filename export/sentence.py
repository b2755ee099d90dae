"""A sentence-transformers folder's own settings: ``modules.json`` and the modules it lists.

Read without sentence-transformers (the export does not depend on it): ``Transformer`` (the BERT
checkpoint in the folder itself, with ``sentence_bert_config.json``'s ``max_seq_length`` and
``do_lower_case``, or since sentence-transformers 5 the tokenizer's ``model_max_length`` and normalizer), ``Pooling`` (one mode; ``include_prompt``), ``Dense`` (weights read with torch, run
after pooling) and ``Normalize``, plus ``config_sentence_transformers.json``'s ``prompts`` and
``default_prompt_name``. Anything else is refused with one line naming it: serving a folder without one
of its modules would answer vectors that ``SentenceTransformer(folder).encode`` does not.

What is read is carried into the export here too: ``do_lower_case`` as a normalizer in the saved
tokenizer, the Dense weights as .npy files, and the manifest's defaults (pooling, normalize, prompts…).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from app.model.manifest import Defaults, DenseLayer, Sparse, sha256_file
from export.source import ExportError

MODULES = "modules.json"
# The module types served, by the last part of their "type" ("sentence_transformers.models.Pooling", or
# "sentence_transformers.sentence_transformer.modules.pooling.Pooling" in newer folders).
SERVED = ("Transformer", "Pooling", "Dense", "Normalize")
# A SparseEncoder folder's modules (read_sparse): MLMTransformer → SpladePooling, or an inference-free
# SPLADE's, which are refused.
SPARSE_MODULES = ("MLMTransformer", "SpladePooling", "SparseStaticEmbedding", "SparseAutoEncoder")
# sentence-transformers' pooling modes → ours (app/engine/pooling.py).
POOLING_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "lasttoken",
}
# The legacy config keys (before sentence-transformers 5.x's "pooling_mode"), in its order.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


@dataclass(frozen=True)
class Dense:
    weight: np.ndarray  # [out, in] float32
    bias: np.ndarray | None  # [out]
    activation: str  # a key of app/model/manifest.py's DenseLayer.activation


@dataclass(frozen=True)
class SentenceConfig:
    """What a sentence-transformers folder says about serving it."""

    pooling: str
    include_prompt: bool
    normalize: bool
    max_seq_length: int | None
    do_lower_case: bool
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    dense: tuple[Dense, ...] = ()
    modules: tuple[str, ...] = ()


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} is not readable JSON: {exc}") from exc


def _json(path: Path) -> dict[str, Any]:
    raw = _load(path)
    if not isinstance(raw, dict):
        raise ExportError(f"{path} is not a JSON object")
    return raw


def _type(entry: dict[str, Any]) -> str:
    return str(entry.get("type", "")).rpartition(".")[2]


def _modules(folder: Path) -> tuple[Path, list[Any], list[str]] | None:
    """``folder``'s ``modules.json``, its entries and their module types; None when it has none.

    Raises:
        ExportError: a file that lists no modules.
    """
    path = folder / MODULES
    if not path.is_file():
        return None
    entries = _load(path)
    if not isinstance(entries, list) or not entries:
        raise ExportError(f"{path} lists no modules")
    return path, entries, [_type(e) for e in entries]


def read(folder: Path) -> SentenceConfig | None:
    """The settings of the sentence-transformers folder ``folder``; None when it has no ``modules.json``.

    Raises:
        ExportError: a module that cannot be served (named), or a malformed file.
    """
    listed = _modules(folder)
    if listed is None:
        return None
    path, entries, types = listed
    if any(t in SPARSE_MODULES for t in types):
        return None  # a SparseEncoder folder: read_sparse's
    for entry, kind in zip(entries, types, strict=True):
        if kind not in SERVED:
            raise ExportError(
                f"{path}: module {entry.get('type')!r} ({entry.get('path') or 'no folder'}) cannot be served; "
                f"served modules are {', '.join(SERVED)}"
            )
    if entries[0].get("path", "") != "":
        raise ExportError(
            f"{path}: the Transformer must be the folder itself, not {entries[0].get('path')!r}"
        )
    tail = types[2:-1] if types[-1] == "Normalize" else types[2:]
    if types[:2] != ["Transformer", "Pooling"] or any(t != "Dense" for t in tail):
        raise ExportError(
            f"{path}: modules {' → '.join(types)} cannot be served; served is "
            "Transformer → Pooling → Dense (any number) → Normalize (optional)"
        )

    bert = folder / "sentence_bert_config.json"
    settings = _json(bert) if bert.is_file() else {}
    max_seq = _max_seq_length(folder, settings)
    pooling_entry = entries[types.index("Pooling")]
    mode, include_prompt = _pooling(folder / str(pooling_entry.get("path", "")))
    dense = tuple(
        _dense(folder / str(e.get("path", ""))) for e, t in zip(entries, types, strict=True) if t == "Dense"
    )
    prompts: dict[str, str] = {}
    default_prompt = None
    st_config = folder / "config_sentence_transformers.json"
    if st_config.is_file():
        raw = _json(st_config)
        prompts = {str(k): str(v) for k, v in (raw.get("prompts") or {}).items() if v is not None}
        default_prompt = raw.get("default_prompt_name")
        if default_prompt is not None and default_prompt not in prompts:
            raise ExportError(
                f"{st_config}: default_prompt_name {default_prompt!r} is not one of its prompts"
            )
    return SentenceConfig(
        pooling=mode,
        include_prompt=include_prompt,
        normalize="Normalize" in types,
        max_seq_length=max_seq,
        do_lower_case=bool(settings.get("do_lower_case", False)),
        prompts=prompts,
        default_prompt_name=default_prompt,
        dense=dense,
        modules=tuple(types),
    )


def _max_seq_length(folder: Path, settings: dict[str, Any]) -> int | None:
    """``max_seq_length`` of ``sentence_bert_config.json`` (``settings``), or as sentence-transformers 5
    keeps it, the tokenizer's ``model_max_length`` (and do_lower_case as a Lowercase normalizer in
    tokenizer.json itself)."""
    max_seq = settings.get("max_seq_length")
    if max_seq is None:
        tokenizer_config = folder / "tokenizer_config.json"
        limit = _json(tokenizer_config).get("model_max_length") if tokenizer_config.is_file() else None
        max_seq = limit if isinstance(limit, int) and limit < 1_000_000 else None
    return int(max_seq) if isinstance(max_seq, int) else None


@dataclass(frozen=True)
class SparseConfig:
    """What a sentence-transformers ``SparseEncoder`` folder (MLMTransformer → SpladePooling) says."""

    sparse: Sparse
    max_seq_length: int | None
    do_lower_case: bool


def read_sparse(folder: Path) -> SparseConfig | None:
    """The SPLADE settings of the ``SparseEncoder`` folder ``folder``: its SpladePooling's strategy and
    activation, its max_seq_length; None when ``folder`` is not one (no ``modules.json``, or one without
    sparse modules).

    Raises:
        ExportError: a sparse folder this service cannot serve, named with the reason (an inference-free
            SPLADE's SparseStaticEmbedding or Router, a module after the pooling, a malformed config).
    """
    listed = _modules(folder)
    if listed is None:
        return None
    path, entries, types = listed
    if not any(t in SPARSE_MODULES for t in types):
        return None
    if "SparseStaticEmbedding" in types or "Router" in types:
        raise ExportError(
            f"{path}: modules {' → '.join(types)} are an inference-free (asymmetric) SPLADE, whose query side "
            "is a SparseStaticEmbedding lookup and not the BERT: it cannot be served; served is "
            "MLMTransformer → SpladePooling"
        )
    bert = folder / "sentence_bert_config.json"
    settings = _json(bert) if bert.is_file() else {}
    # sentence-transformers 5.4+ writes a Transformer with transformer_task "fill-mask"; earlier, MLMTransformer.
    masked_lm = types[0] == "MLMTransformer" or (
        types[0] == "Transformer" and settings.get("transformer_task") == "fill-mask"
    )
    if not masked_lm or types[1:] != ["SpladePooling"] or entries[0].get("path", "") != "":
        raise ExportError(
            f"{path}: modules {' → '.join(types)} cannot be served; served is a masked-LM Transformer "
            "(MLMTransformer, or Transformer with transformer_task fill-mask; the folder itself) → SpladePooling"
        )
    raw = _json(folder / str(entries[1].get("path", "")) / "config.json")
    pooling, activation = raw.get("pooling_strategy", "max"), raw.get("activation_function", "relu")
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ExportError(
            f"{folder}: SpladePooling {pooling!r} / {activation!r} cannot be served; served are the "
            "pooling strategies max and sum and the activations relu and log1p_relu"
        )
    return SparseConfig(
        sparse=Sparse(pooling=pooling, activation=activation),
        max_seq_length=_max_seq_length(folder, settings),
        do_lower_case=bool(settings.get("do_lower_case", False)),
    )


def _pooling(folder: Path) -> tuple[str, bool]:
    raw = _json(folder / "config.json")
    modes: Any = raw.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if raw.get(key)] or ["mean"]
    if isinstance(modes, str):
        modes = [modes]
    if len(modes) != 1:
        raise ExportError(
            f"{folder}: Pooling with several modes at once ({' + '.join(modes)}) cannot be served; one mode is"
        )
    if modes[0] not in POOLING_MODES:
        raise ExportError(f"{folder}: pooling mode {modes[0]!r} cannot be served")
    return POOLING_MODES[modes[0]], bool(raw.get("include_prompt", True))


def _dense(folder: Path) -> Dense:
    raw = _json(folder / "config.json")
    activation_name = str(raw.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if activation_name not in ACTIVATIONS:
        raise ExportError(
            f"{folder}: Dense activation {activation_name!r} cannot be served "
            f"(served: {', '.join(ACTIVATIONS)})"
        )
    state = _weights(folder)
    weight = state.get("linear.weight")
    if weight is None:
        raise ExportError(f"{folder}: Dense weights have no linear.weight")
    bias = state.get("linear.bias")
    out_features, in_features = int(raw.get("out_features", -1)), int(raw.get("in_features", -1))
    if tuple(weight.shape) != (out_features, in_features):
        raise ExportError(
            f"{folder}: Dense weight is {tuple(weight.shape)}, config says {out_features}×{in_features}"
        )
    return Dense(
        weight=weight.astype(np.float32),
        bias=bias.astype(np.float32) if bias is not None else None,
        activation=ACTIVATIONS[activation_name],
    )


def _weights(folder: Path) -> dict[str, np.ndarray]:
    if (folder / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        return dict(load_file(str(folder / "model.safetensors")))
    if (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise ExportError(f"{folder}: Dense module without model.safetensors or pytorch_model.bin")


def torch_dense(vectors: torch.Tensor, layers: tuple[Dense, ...]) -> torch.Tensor:
    """The Dense modules in PyTorch, as sentence-transformers runs them (the export's reference)."""
    activations = {
        "identity": torch.nn.Identity(),
        "tanh": torch.nn.Tanh(),
        "relu": torch.nn.ReLU(),
        "sigmoid": torch.nn.Sigmoid(),
    }
    for layer in layers:
        bias = torch.from_numpy(layer.bias) if layer.bias is not None else None
        vectors = activations[layer.activation](
            torch.nn.functional.linear(vectors, torch.from_numpy(layer.weight), bias)
        )
    return vectors


# ---- carrying the settings into the export: the saved tokenizer, the Dense weights, the manifest's defaults


def lowercase(tokenizer: PreTrainedTokenizerFast) -> None:
    """sentence_bert_config.json's ``do_lower_case``, as sentence-transformers applies it: a Lowercase
    normalizer in front of the tokenizer's own (unless it has one), so the saved tokenizer.json does it."""
    from tokenizers.normalizers import Lowercase, Sequence

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    if isinstance(current, Lowercase) or (
        isinstance(current, Sequence) and any(isinstance(n, Lowercase) for n in current)
    ):
        return
    chain = [Lowercase()]
    if isinstance(current, Sequence):
        chain += list(current)
    elif current is not None:
        chain.append(current)
    backend.normalizer = Sequence(chain)


def save_dense(folder: Path, layers: tuple[Dense, ...]) -> tuple[list[DenseLayer], dict[str, str]]:
    """Write each Dense module's weights as .npy files; their manifest entries and file hashes."""
    entries: list[DenseLayer] = []
    files: dict[str, str] = {}
    for k, layer in enumerate(layers):
        weight = f"dense_{k}.weight.npy"
        np.save(folder / weight, layer.weight)
        files[weight] = sha256_file(folder / weight)
        bias = None
        if layer.bias is not None:
            bias = f"dense_{k}.bias.npy"
            np.save(folder / bias, layer.bias)
            files[bias] = sha256_file(folder / bias)
        out_features, in_features = layer.weight.shape
        entries.append(
            DenseLayer(
                weight=weight,
                bias=bias,
                in_features=in_features,
                out_features=out_features,
                activation=layer.activation,  # type: ignore[arg-type]
            )
        )
    return entries, files


def defaults(
    st: SentenceConfig | None, dense: list[DenseLayer], matryoshka: tuple[bool, list[int] | None]
) -> Defaults:
    """A plain BERT's defaults, or a sentence-transformers folder's own (as ``encode`` serves it); with
    either, whether it was trained for shorter vectors (``matryoshka``: trained, and the widths if listed)."""
    trained, listed = matryoshka
    if st is None:
        return Defaults(matryoshka=trained, matryoshka_dimensions=listed)
    return Defaults(
        source="sentence-transformers",
        pooling=st.pooling,
        normalize=st.normalize,
        long_text="truncate",
        include_prompt=st.include_prompt,
        do_lower_case=st.do_lower_case,
        prompts=st.prompts,
        default_prompt_name=st.default_prompt_name,
        dense=dense,
        modules=list(st.modules),
        matryoshka=trained,
        matryoshka_dimensions=listed,
    )
