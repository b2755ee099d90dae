"""A sentence-transformers ``SparseEncoder`` folder from the bert-base-chinese twin's weights, exported, and
its ``POST /embed_sparse`` against ``SparseEncoder.encode`` on 50 Chinese texts of mixed lengths.

    python -m loadtest.sparse_twin [--out build/sparse-twin] [--texts 50] [--pooling max] [--tiny] \
        [--skip-export]

Writes ``OUT/sparse-encoder`` (``MLMTransformer`` → ``SpladePooling``, the twin's random weights: those of
``python -m loadtest.make_twin``; with ``--tiny`` the tests' tiny BERT instead), exports it with
``python -m export`` to ``OUT/model`` (fp32, int8), serves each variant with ``python -m app`` and prints
one table: fp32 against ``SparseEncoder.encode`` (the rows whose non-zero indices are the same, the
worst difference as the tests hold it: export/validate.py's ``sparse_agreement``), int8 against it
(top-64 index overlap, sparse cosine), and both sides' fp32 against SparseEncoder in float64: the
rounding each has. The weights are random: the numbers say what the arithmetic does on these shapes,
not what a trained SPLADE model retrieves. ``OUT/model`` is also the model of the sparse speed run
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from export.__main__ import main as export_main
from export.source import bert_base_chinese_vocab, load, resolve, write_source_folder
from export.spec import BERT_BASE_CHINESE_CONFIG
from export.validate import sparse_agreement, sparse_metrics
from loadtest.corpus import load_corpus
from loadtest.harness.service import service_env
from loadtest.server import HOST, ServiceProcess

# Texts per /embed_sparse request: under the service's default max_inputs_per_request (64).
PER_REQUEST = 16


def mixed_lengths(texts: list[str], n: int, max_chars: int | None = None) -> list[str]:
    """``n`` distinct texts spread evenly over the lengths of ``texts`` (shortest to longest, each at most
    ``max_chars`` characters when given)."""
    pool = sorted({t for t in texts if max_chars is None or len(t) <= max_chars}, key=lambda t: (len(t), t))
    if len(pool) < n:
        raise ValueError(f"{n} texts asked for, {len(pool)} distinct ones to choose from")
    return [pool[int(i)] for i in np.linspace(0, len(pool) - 1, n).round()]


def write_sparse_encoder(checkpoint: Path, folder: Path, pooling: str) -> Path:
    """``SparseEncoder(MLMTransformer(checkpoint) → SpladePooling(pooling))`` saved to ``folder``."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    modules = [MLMTransformer(str(checkpoint)), SpladePooling(pooling)]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))
    return folder


def write_twin_checkpoint(folder: Path, config: dict[str, object] = BERT_BASE_CHINESE_CONFIG) -> Path:
    """A ``BertForMaskedLM`` checkpoint holding the random weights ``python -m export --twin`` gives
    ``config`` (export/source.py ``load``; bert-base-chinese's: the encoder and masked-LM head of
    ``python -m loadtest.make_twin``), with the real vocab."""
    from transformers import BertForMaskedLM

    write_source_folder(folder, config, bert_base_chinese_vocab())
    twin = load(resolve(str(folder), None), twin=True)
    assert twin.mlm_head is not None, "the twin has no masked-LM head"
    model = BertForMaskedLM(twin.config).eval()
    missing, unexpected = model.bert.load_state_dict(twin.bert.state_dict(), strict=False)
    assert not missing and all(k.startswith("pooler.") for k in unexpected), (missing, unexpected)
    model.cls.predictions.load_state_dict(twin.mlm_head.state_dict())
    model.save_pretrained(folder)
    return folder


def write_tiny_checkpoint(folder: Path) -> Path:
    """The tests' tiny BERT (tests/conftest.py: 3 layers, hidden 64, seed 7, the real vocab)."""
    from tests.conftest import make_tiny_source

    return make_tiny_source(folder)


def build(out: Path, pooling: str, variants: str, tiny: bool) -> Path:
    """``OUT/sparse-encoder`` and its export ``OUT/model``; returns the folder.

    Raises:
        RuntimeError: the export failed (its message is above).
    """
    folder = out / "sparse-encoder"
    with tempfile.TemporaryDirectory(prefix="sparse-twin-") as tmp:
        checkpoint = (write_tiny_checkpoint if tiny else write_twin_checkpoint)(Path(tmp))
        write_sparse_encoder(checkpoint, folder, pooling)
    code = export_main(
        ["--model", str(folder), "--out", str(out / "model"), "--variants", variants, "--force"]
    )
    if code != 0:
        raise RuntimeError(f"python -m export exited {code}")
    return folder


def served(model: Path, variant: str, texts: list[str], vocab: int, logs: Path) -> np.ndarray:
    """``POST /embed_sparse`` of ``texts`` on ``python -m app`` serving ``variant``, as [texts, vocab]
    (``truncate``: an over-long text is cut as SparseEncoder cuts it, to the model's length)."""
    env = service_env(model, variant, len(texts), max_inputs_per_request=PER_REQUEST)
    rows: list[list[dict[str, Any]]] = []
    log = logs / f"sparse-twin-{variant}.log"
    with (
        ServiceProcess("app", env, log) as svc,
        httpx.Client(base_url=f"http://{HOST}:{svc.port}", timeout=600) as client,
    ):
        for i in range(0, len(texts), PER_REQUEST):
            body = {"inputs": texts[i : i + PER_REQUEST], "truncate": True}
            answer = client.post("/embed_sparse", json=body)
            answer.raise_for_status()
            rows.extend(answer.json())
    vectors = np.zeros((len(rows), vocab), np.float32)
    for row, entries in enumerate(rows):
        for entry in entries:
            vectors[row, int(entry["index"])] = entry["value"]
    return vectors


def reference(folder: Path, texts: list[str], float64: bool) -> np.ndarray:
    """``SparseEncoder(folder).encode(texts)`` [texts, vocab], in float64 when asked."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    if float64:
        model = model.double()
    return model.encode(texts, convert_to_sparse_tensor=False).cpu().numpy()


def table(rows: list[tuple[str, dict[str, float]]]) -> list[str]:
    """The report: one row per comparison, the metrics it has (``-`` for the others)."""
    columns = [
        ("same non-zero indices", "same_nonzero_share", ".0%"),
        ("indices on one side only", "index_mismatches", ".0f"),
        ("max rel diff (floor 1% of max)", "max_rel_diff", ".2e"),
        ("max rel diff, weights ≥ 1e-3", "max_rel_diff_above_1e-3", ".2e"),
        ("max diff / vector max", "max_diff_of_max", ".2e"),
        ("1e-4 rel above (of max)", "rtol_floor_of_max", ".2%"),
        ("top-64 overlap min / mean", "top64", ""),
        ("sparse cosine min / mean", "cosine", ""),
    ]
    out = [
        "| comparison | " + " | ".join(name for name, _, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for label, m in rows:
        cells = []
        for _, key, fmt in columns:
            if key == "top64":
                cells.append(f"{m['sparse_top64_overlap_min']:.3f} / {m['top64_overlap_mean']:.3f}")
            elif key == "cosine":
                cells.append(f"{m['sparse_cosine_min']:.5f} / {m['cosine_mean']:.5f}")
            else:
                cells.append(format(m[key], fmt) if key in m else "-")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def measured(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """Every metric of the table of ``got`` against ``want``."""
    metrics = {**sparse_metrics(got, want), **sparse_agreement(got, want)}
    k = min(64, want.shape[1])
    top_got, top_want = np.argsort(-got, axis=1)[:, :k], np.argsort(-want, axis=1)[:, :k]
    overlap = [len(set(a) & set(b)) / k for a, b in zip(top_got.tolist(), top_want.tolist(), strict=True)]
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cosines = (got * want).sum(axis=1) / np.where(norms > 0, norms, np.inf)
    metrics.update(top64_overlap_mean=float(np.mean(overlap)), cosine_mean=float(cosines.mean()))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.sparse_twin", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("build/sparse-twin"))
    parser.add_argument("--texts", type=int, default=50, help="texts of the corpus, of mixed lengths")
    parser.add_argument("--pooling", choices=("max", "sum"), default="max", help="SpladePooling's strategy")
    parser.add_argument("--variants", default="fp32,int8", help="exported and compared")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny BERT instead of the twin")
    parser.add_argument("--skip-export", action="store_true", help="OUT/model is already exported")
    args = parser.parse_args(argv)
    folder = args.out / "sparse-encoder"
    if not args.skip_export:
        build(args.out, args.pooling, args.variants, args.tiny)
    texts = mixed_lengths(load_corpus(), args.texts)
    print(f"{len(texts)} texts of {min(map(len, texts))} to {max(map(len, texts))} characters", flush=True)
    want = reference(folder, texts, float64=False)
    exact = reference(folder, texts, float64=True)
    rows = [("SparseEncoder fp32 vs its float64", measured(want.astype(np.float64), exact))]
    for variant in args.variants.split(","):
        got = served(args.out / "model", variant, texts, want.shape[1], args.out / "logs")
        rows.append((f"/embed_sparse {variant} vs SparseEncoder fp32", measured(got, want)))
        if variant == "fp32":
            rows.append(("/embed_sparse fp32 vs SparseEncoder float64", measured(got, exact)))
    print("\n".join(table(rows)))
    which = "the tests' tiny BERT" if args.tiny else "the bert-base-chinese twin"
    print(f"Random weights ({which}): shapes and arithmetic, not retrieval quality.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
