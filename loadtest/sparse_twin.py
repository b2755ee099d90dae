"""A sentence-transformers ``SparseEncoder`` folder from the bert-base-chinese twin's weights, exported, and
its ``POST /embed_sparse`` against ``SparseEncoder.encode`` on 50 Chinese texts of mixed lengths.

    python -m loadtest.sparse_twin [--out build/sparse-twin] [--texts 50] [--pooling max] [--tiny]

Writes ``OUT/sparse-encoder`` (``MLMTransformer`` → ``SpladePooling``, the random weights of
``python -m loadtest.make_twin``'s twin, or with ``--tiny`` the tests' tiny BERT), exports it to
``OUT/model`` (also the model of the sparse speed run), serves each variant with ``python -m app`` and
prints one table: each variant against ``SparseEncoder.encode`` (fp32 as the tests hold it, int8 by
top-64 overlap and cosine), and both sides' fp32 against SparseEncoder in float64. Random weights: the
arithmetic on these shapes, not what a trained SPLADE model retrieves.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from export.__main__ import main as export_main
from export.source import bert_base_chinese_vocab, load, resolve, write_source_folder
from export.spec import BERT_BASE_CHINESE_CONFIG
from export.validate import sparse_agreement, sparse_metrics
from loadtest.corpus import load_corpus
from loadtest.harness import parser
from loadtest.harness.service import service_env
from loadtest.server import ServiceProcess, post

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
    """A checkpoint of ``config`` with the real vocab, holding the random weights ``python -m export --twin``
    gives it (bert-base-chinese's: those of ``python -m loadtest.make_twin``)."""
    from transformers import BertForPreTraining

    write_source_folder(folder, config, bert_base_chinese_vocab())
    twin = load(resolve(str(folder), None), twin=True)
    assert twin.mlm_head is not None, "the twin has no masked-LM head"
    model = BertForPreTraining(twin.config)
    model.bert.load_state_dict(twin.bert.state_dict())
    model.cls.predictions.load_state_dict(twin.mlm_head.state_dict())
    model.save_pretrained(folder)
    return folder


def build(out: Path, pooling: str, variants: str, tiny: bool) -> Path:
    """``OUT/sparse-encoder`` and its export ``OUT/model`` (RuntimeError when the export fails); the folder."""
    from tests.conftest import make_tiny_source  # the tests' tiny BERT: 3 layers, hidden 64, the real vocab

    folder = out / "sparse-encoder"
    with tempfile.TemporaryDirectory(prefix="sparse-twin-") as tmp:
        checkpoint = (make_tiny_source if tiny else write_twin_checkpoint)(Path(tmp))
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
    with ServiceProcess("app", env, logs / f"sparse-twin-{variant}.log") as svc:
        for i in range(0, len(texts), PER_REQUEST):
            body = orjson.dumps({"inputs": texts[i : i + PER_REQUEST], "truncate": True})
            answer = post(svc.port, "/embed_sparse", body)
            if answer.status_code != 200:
                raise RuntimeError(f"/embed_sparse answered {answer.status_code}: {answer.content[:300]!r}")
            rows.extend(orjson.loads(answer.content))
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
    columns = [  # (name, the metrics it shows, separated by " / ", their format)
        ("same non-zero indices", ("same_nonzero_share",), ".0%"),
        ("indices on one side only", ("index_mismatches",), ".0f"),
        ("max rel diff (floor 1% of max)", ("max_rel_diff",), ".2e"),
        ("max rel diff, weights ≥ 1e-3", ("max_rel_diff_above_1e-3",), ".2e"),
        ("max diff / vector max", ("max_diff_of_max",), ".2e"),
        ("1e-4 rel above (of max)", ("rtol_floor_of_max",), ".2%"),
        ("top-64 overlap min / mean", ("sparse_top64_overlap_min", "top64_overlap_mean"), ".3f"),
        ("sparse cosine min / mean", ("sparse_cosine_min", "cosine_mean"), ".5f"),
    ]
    out = [
        "| comparison | " + " | ".join(name for name, _, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for label, m in rows:
        cells = [
            " / ".join(format(m[k], fmt) for k in keys) if keys[0] in m else "-" for _, keys, fmt in columns
        ]
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
    p = parser("loadtest.sparse_twin", __doc__)
    p.add_argument("--out", type=Path, default=Path("build/sparse-twin"))
    p.add_argument("--texts", type=int, default=50, help="texts of the corpus, of mixed lengths")
    p.add_argument("--pooling", choices=("max", "sum"), default="max", help="SpladePooling's strategy")
    p.add_argument("--variants", default="fp32,int8", help="exported and compared")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny BERT instead of the twin")
    args = p.parse_args(argv)
    folder = build(args.out, args.pooling, args.variants, args.tiny)
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
