"""The contract between the export stage and the service: ``manifest.json``.

The export stage writes it (``export/``), the service trusts nothing else (``app/``). Every graph, its
inputs and outputs, which output holds which layer, the tokenizer files and every file's sha256 are
declared here once and read everywhere else.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path, PurePath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# 2: the encoder also returns each layer's pooled vectors (``pooled_outputs``). 3: the model's kind, its
# serving defaults (a sentence-transformers folder's own settings) and its fine-tuned head.
SCHEMA_VERSION = 3
MANIFEST_NAME = "manifest.json"

# The CPU an int8 graph was exported for (its recipe's "cpu"): any x86-64, or only CPUs with VNNI.
ANY_CPU = "any"
VNNI = "vnni"

Variant = Literal["fp32", "fp16", "int8"]
# The poolings the encoder graph may compute itself, per layer (app/engine/pooling.py has the same in
# numpy). Every graph has "cls" and "mean"; a sentence-transformers model's own mode is added to its graph.
PooledMode = Literal["cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken"]
POOLED_MODES: tuple[PooledMode, ...] = ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
ALWAYS_POOLED: tuple[PooledMode, ...] = ("cls", "mean")
# What a model is for: embeddings (any BERT, a sentence-transformers folder), or a fine-tuned head.
Kind = Literal["embedding", "classifier", "reranker", "tagger"]
KIND_NAMES: dict[str, str] = {
    "embedding": "an embedding model",
    "classifier": "a sequence classifier (BertForSequenceClassification)",
    "reranker": "a cross-encoder reranker (BertForSequenceClassification with one label)",
    "tagger": "a token classifier (BertForTokenClassification)",
}
VARIANTS: tuple[Variant, ...] = ("fp32", "fp16", "int8")
GraphName = Literal["encoder", "mlm_head", "sparse"]
GRAPH_NAMES: tuple[GraphName, ...] = ("encoder", "mlm_head", "sparse")
# SPLADE: how the sparse graph pools log(1 + relu(MLM logits)) over a sequence's real tokens, and the
# activation before (``log1p_relu``: log1p once more, as OpenSearch's models do); sentence-transformers'
# SpladePooling vocabulary.
SparsePoolingStrategy = Literal["max", "sum"]
SparseActivation = Literal["relu", "log1p_relu"]

# Names of the encoder graph's tensors. Layer i (1-based) is `hidden_state_{i}`, except the last layer,
# which is `last_hidden_state` (one tensor cannot be two graph outputs).
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
LAST_HIDDEN_STATE = "last_hidden_state"
POOLER_OUTPUT = "pooler_output"
MLM_INPUT = "hidden"
MLM_OUTPUT = "logits"
# The sparse graph reads the encoder's last hidden state and the attention mask; it returns per sequence
# one weight per vocabulary entry, [batch, vocab] (the [batch, seq, vocab] logits stay inside it).
SPARSE_INPUTS = (LAST_HIDDEN_STATE, "attention_mask")
SPARSE_OUTPUT = "sparse"
# A fine-tuned head's logits, an encoder output: [batch, labels] (classifier, reranker) or
# [batch, sequence, labels] (tagger).
HEAD_OUTPUT = "head_logits"


def layer_output_name(layer: int, num_layers: int) -> str:
    """The encoder output that holds 1-based ``layer``'s hidden state."""
    if not 1 <= layer <= num_layers:
        raise ValueError(f"layer {layer} is outside 1..{num_layers}")
    return LAST_HIDDEN_STATE if layer == num_layers else f"hidden_state_{layer}"


def pooled_output_name(mode: PooledMode, layer: int, num_layers: int) -> str:
    """The encoder output that holds 1-based ``layer``'s ``mode``-pooled vector [batch, hidden]: the
    [CLS] state (``cls_{layer}``) or the mean over real tokens, [CLS] and [SEP] included (``mean_{layer}``).
    """
    if mode not in POOLED_MODES:
        raise ValueError(f"pooling {mode!r} is not computed in the graph (only {', '.join(POOLED_MODES)})")
    if not 1 <= layer <= num_layers:
        raise ValueError(f"layer {layer} is outside 1..{num_layers}")
    return f"{mode}_{layer}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TensorSpec(_Frozen):
    name: str
    dtype: str
    # Dimension names ("batch", "sequence", "k") are dynamic; integers are fixed.
    shape: list[str | int]


class GraphFile(_Frozen):
    file: str
    sha256: str
    bytes: int
    dtype: Variant
    provider: str = Field(description="The execution provider this variant is meant for.")
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    recipe: dict[str, str | bool | int] = Field(default_factory=dict, description="How it was made.")

    @property
    def cpu(self) -> str:
        """The CPUs this graph computes right on: ``VNNI`` or ``ANY_CPU`` (also for graphs that predate it)."""
        return str(self.recipe.get("cpu", ANY_CPU))


class Source(_Frozen):
    model: str = Field(description="Hub id or local path the export read.")
    revision: str | None
    local: bool
    weights: Literal["pretrained", "random"]
    weights_sha256: str | None = Field(description="sha256 of the source weights file; None for a twin.")
    fingerprint: str = Field(description="sha256 over the source and export options; equal means no-op.")

    def name(self) -> str:
        """The model's name for clients: the hub id, or a local folder's last part (never a full path,
        which would tell clients how the server's disk is laid out)."""
        return PurePath(self.model).name if self.local else self.model


class ModelConfig(_Frozen):
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    has_pooler: bool
    has_mlm_head: bool


class TokenizerInfo(_Frozen):
    files: dict[str, str] = Field(description="file name -> sha256")
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    unk_id: int
    max_length: int
    do_lower_case: bool


class DenseLayer(_Frozen):
    """A sentence-transformers ``Dense`` module: ``activation(x @ weight.T + bias)``, run after pooling."""

    weight: str = Field(description="a .npy file [out, in], float32")
    bias: str | None = Field(description="a .npy file [out], float32; None without bias")
    in_features: int
    out_features: int
    activation: Literal["identity", "tanh", "relu", "sigmoid"]


class Defaults(_Frozen):
    """What a request that leaves the options out gets, and where that came from.

    A plain BERT folder: mean pooling, normalised, over-long inputs refused. A sentence-transformers
    folder: its ``Pooling`` mode, ``Normalize`` (or none), ``Dense`` modules, truncation at its
    ``max_seq_length`` (as ``encode`` does), its ``do_lower_case`` and prompts. Either: whether it was
    trained for shorter vectors (Matryoshka), which decides what a request's ``dimensions`` may ask.
    """

    source: Literal["bert", "sentence-transformers"] = "bert"
    pooling: str = "mean"
    normalize: bool = True
    long_text: Literal["error", "truncate"] = "error"
    include_prompt: bool = True
    do_lower_case: bool = False
    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None
    dense: list[DenseLayer] = Field(default_factory=list)
    modules: list[str] = Field(default_factory=list, description="the sentence-transformers modules read")
    # Read with a default, so a manifest written before these fields reads as "not trained for it".
    matryoshka: bool = Field(
        default=False,
        description="trained for shorter vectors (Matryoshka): a request's dimensions keeps the first ones; "
        "from config.json is_matryoshka / matryoshka_dimensions (as vLLM reads them) or --matryoshka-dimensions",
    )
    matryoshka_dimensions: list[int] | None = Field(
        default=None, description="the widths it was trained for, widest first; None: any (is_matryoshka)"
    )


class Head(_Frozen):
    """A fine-tuned head exported into the encoder graph (its logits are ``HEAD_OUTPUT``)."""

    architecture: str
    labels: dict[int, str] = Field(description="id2label")
    problem_type: str | None = Field(description="the config's problem_type, as transformers reads it")
    activation: Literal["softmax", "sigmoid", "identity"] = Field(
        description="how scores come from logits, as transformers' pipeline / CrossEncoder choose"
    )


class Metric(_Frozen):
    value: float
    threshold: float | None
    op: Literal[">=", "<="] | None
    enforced: bool
    passed: bool


class Validation(_Frozen):
    variant: Variant
    provider: str
    sentences: int
    metrics: dict[str, Metric]
    passed: bool


class Sparse(_Frozen):
    """What the sparse graph computes: SPLADE's ``pooling`` over tokens of ``activation`` then log1p."""

    pooling: SparsePoolingStrategy = "max"
    activation: SparseActivation = "relu"


class Manifest(_Frozen):
    schema_version: int = SCHEMA_VERSION
    source: Source
    kind: Kind = "embedding"
    config: ModelConfig
    defaults: Defaults = Field(default_factory=Defaults)
    head: Head | None = None
    tokenizer: TokenizerInfo
    graphs: dict[GraphName, dict[Variant, GraphFile]]
    layer_outputs: dict[int, str] = Field(description="1-based layer -> encoder output name")
    pooled_outputs: dict[PooledMode, dict[int, str]] = Field(
        description="pooling mode -> 1-based layer -> encoder output of that pooled vector [batch, hidden]"
    )
    validation: dict[Variant, Validation]
    versions: dict[str, str]
    timings_s: dict[str, float]
    options: dict[str, str | int | bool | list[str]]
    created_at: str
    extra_files: dict[str, str] = Field(default_factory=dict, description="Dense weights: file -> sha256")
    sparse: Sparse | None = Field(
        default=None, description="The sparse (SPLADE) graph's pooling, if exported."
    )

    @property
    def variants(self) -> list[Variant]:
        return [v for v in VARIANTS if v in self.graphs.get("encoder", {})]

    def files(self) -> dict[str, str]:
        """Every file the manifest lists besides the graphs: tokenizer files and Dense weights."""
        return dict(self.tokenizer.files) | self.extra_files

    def dump(self, folder: Path) -> Path:
        path = folder / MANIFEST_NAME
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")
        return path


class ManifestError(RuntimeError):
    """The model folder is missing, incomplete, or its files do not match the manifest."""


class OutdatedManifestError(ManifestError):
    """The folder was exported for an older schema_version than this build reads: it needs a re-export,
    and the message gives the exact command."""

    def __init__(self, folder: Path, found: int, command: str) -> None:
        super().__init__(
            f"{folder / MANIFEST_NAME} has schema_version {found}, older than the {SCHEMA_VERSION} this build "
            f"reads: export it again with: {command}"
        )
        self.folder = folder
        self.found = found
        self.command = command


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _section(raw: dict[str, object], key: str) -> dict[str, object]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def reexport_command(folder: Path, raw: dict[str, object]) -> str:
    """The ``python -m export`` command that exports ``folder`` again from the source and options its
    manifest (``raw``, as read: any schema version) records, replacing it."""
    source, options = _section(raw, "source"), _section(raw, "options")
    variants = options.get("variants")
    command = ["python", "-m", "export", "--model", str(source.get("model") or "SRC"), "--out", str(folder)]
    if source.get("revision"):
        command += ["--revision", str(source["revision"])]
    if isinstance(variants, list):
        command += ["--variants", ",".join(str(v) for v in variants)]
    if isinstance(options.get("opset"), int):
        command += ["--opset", str(options["opset"])]
    if options.get("twin") is True:
        command.append("--twin")
    if isinstance(options.get("matryoshka"), str):
        command += ["--matryoshka-dimensions", str(options["matryoshka"])]
    return shlex.join([*command, "--force"])


def _refuse_outdated(folder: Path, raw: dict[str, object]) -> None:
    found = raw.get("schema_version")
    if isinstance(found, int) and found < SCHEMA_VERSION:
        raise OutdatedManifestError(folder, found, reexport_command(folder, raw))


def check_schema(folder: Path) -> None:
    """Refuse a folder exported for an older schema; anything else wrong is ``load_manifest``'s to report.

    Raises:
        OutdatedManifestError: ``folder/manifest.json`` has an older schema_version (the message gives
            the command that exports it again).
    """
    try:
        raw = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return  # absent or unreadable: load_manifest says which
    if isinstance(raw, dict):
        _refuse_outdated(folder, raw)


def load_manifest(folder: Path) -> Manifest:
    """Read and parse ``folder/manifest.json``.

    Raises:
        OutdatedManifestError: it is of an older schema version (the message says how to re-export).
        ManifestError: the file is absent, unreadable, of another schema version or malformed.
    """
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path} does not exist: export the model first (python -m export --out {folder})"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} is not a JSON object")
    _refuse_outdated(folder, raw)
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(
            f"{path} has schema_version {raw.get('schema_version')!r}; this build reads {SCHEMA_VERSION}"
        )
    try:
        return Manifest.model_validate(raw)
    except ValueError as exc:
        raise ManifestError(f"{path} does not match the manifest schema: {exc}") from exc


def verify_files(folder: Path, files: dict[str, str]) -> None:
    """Check that each ``file -> sha256`` in ``files`` exists in ``folder`` with that hash.

    Raises:
        ManifestError: listing every missing or mismatching file in one message.
    """
    problems = []
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif (actual := sha256_file(path)) != expected:
            problems.append(f"{name}: sha256 {actual[:12]}… does not match the manifest's {expected[:12]}…")
    if problems:
        raise ManifestError(f"model folder {folder} is corrupt: " + "; ".join(problems))
