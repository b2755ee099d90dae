"""Session fixtures shared by every test area: a tiny BERT with the real bert-base-chinese vocab, exported
once per session by the real export stage (not a fake)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

TINY_CONFIG: dict[str, object] = {
    "architectures": ["BertForPreTraining"],
    "model_type": "bert",
    "vocab_size": 21128,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}


def make_tiny_source(folder: Path, seed: int = 7, config: dict[str, object] | None = None) -> Path:
    """A Hugging Face folder with weights: BertForPreTraining (pooler + MLM head), real vocab.

    ``config`` replaces ``TINY_CONFIG`` (e.g. ``{**TINY_CONFIG, "num_hidden_layers": 4}``).
    """
    import torch
    from transformers import BertConfig, BertForPreTraining

    from export.source import bert_base_chinese_vocab, write_source_folder

    config = TINY_CONFIG if config is None else config
    write_source_folder(folder, config, bert_base_chinese_vocab())
    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig.from_dict(config)).eval()
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def tiny_export_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One folder for the ``--quick`` harness runs' tiny exports (loadtest/quick_model.py): each of its
    (layers, variants) is exported once per session, not once per run. The runs are subprocesses, so the
    folder is handed to them in the environment; parallel workers share it (the parent of their temp dirs)."""
    from loadtest.quick_model import CACHE_VARIABLE

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-export-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_VARIABLE, str(folder))
        yield folder


@pytest.fixture(scope="session")
def tiny_source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_source(tmp_path_factory.mktemp("tiny-source"))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import ExportOptions, run_export

    out = tmp_path_factory.mktemp("tiny-export") / "model"
    run_export(ExportOptions(out=out, model=str(tiny_source_dir)), log=lambda _line: None)
    return out


@pytest.fixture(scope="session")
def tiny_sparse_dir(tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT exported with its SPLADE graph (``--sparse max``), fp32 and int8."""
    from export.pipeline import ExportOptions, run_export

    out = tmp_path_factory.mktemp("tiny-sparse") / "model"
    options = ExportOptions(out=out, model=str(tiny_source_dir), variants=("fp32", "int8"), sparse="max")
    run_export(options, log=lambda _line: None)
    return out


@pytest.fixture(scope="session")
def tiny_sparse_encoder(tiny_source_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A sentence-transformers ``SparseEncoder`` folder (``MLMTransformer`` → ``SpladePooling("max")``) of
    the tiny BERT, and its export (fp32): ``(folder, export)``."""
    from export.pipeline import ExportOptions, run_export
    from loadtest.sparse_twin import write_sparse_encoder

    base = tmp_path_factory.mktemp("tiny-sparse-encoder")
    folder = write_sparse_encoder(tiny_source_dir, base / "folder", "max")
    run_export(
        ExportOptions(out=base / "model", model=str(folder), variants=("fp32",)), log=lambda _line: None
    )
    return folder, base / "model"


# A tiny BERT whose config.json says it was trained for shorter vectors, as a Matryoshka checkpoint's does
# (vLLM reads the same key): requests may ask for these widths of its 64.
MATRYOSHKA_DIMENSIONS = [64, 32, 16]


@pytest.fixture(scope="session")
def matryoshka_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.pipeline import ExportOptions, run_export

    source = make_tiny_source(
        tmp_path_factory.mktemp("matryoshka-source"),
        seed=13,
        config={**TINY_CONFIG, "matryoshka_dimensions": MATRYOSHKA_DIMENSIONS},
    )
    out = tmp_path_factory.mktemp("matryoshka-export") / "model"
    run_export(ExportOptions(out=out, model=str(source), variants=("fp32",)), log=lambda _line: None)
    return out
