"""Stage 4: every variant against PyTorch on the same inputs; a miss fails loudly with every mismatch.

The inputs are at least 32 Chinese sentences of mixed length, run in padded batches so that padding is
exercised. Metrics: pooled-vector cosine (min and mean over sentences of every vector the service returns:
each layer's pooled outputs ``cls_{i}``/``mean_{i}`` against PyTorch's pooling of its own hidden states,
and the pooler), the same minimum per pooled output (``cosine_min/mean_3``: a miss names the output), the
max absolute difference of every layer's hidden states on real tokens and of every pooled output, and
masked-LM top-1 / top-5 agreement.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import PreTrainedTokenizerFast

from app.engine import pooling as np_pooling
from app.engine.postprocess import head_scores
from app.model import dense as np_dense
from app.model.manifest import (
    HEAD_OUTPUT,
    LAST_HIDDEN_STATE,
    MLM_INPUT,
    POOLER_OUTPUT,
    SPARSE_INPUTS,
    SPARSE_OUTPUT,
    Metric,
    PooledMode,
    Sparse,
    Validation,
    Variant,
    layer_output_name,
    pooled_output_name,
)
from export import sentence
from export.source import ExportError, LoadedModel
from export.spec import SEED, THRESHOLDS, Threshold

BATCH = 8
MASK_SHARE = 0.15
# A metric of one output is named "{metric}/{output}" (``cosine_min/mean_3``) and judged by the threshold
# of "{metric}".
PER_OUTPUT = "/"
# Sparse weights below this are left out of the relative and index comparisons: log1p(relu(z)) of a logit
# z within float32's rounding of 0 (a weight of 1e-6 may be 0 in one graph and 2e-6 in the other).
SPARSE_FLOOR = 1e-3
# The fp32 service against sentence-transformers' SparseEncoder (sparse_agreement). ONNX Runtime and
# PyTorch sum a logit's products in another order, and the rounding that leaves is absolute: 4e-7 of the
# vector's largest weight on the tiny BERT (2e-6 on bert-base-chinese's 12 layers), as far as
# SparseEncoder's own fp32 is from its float64 (docs/performance-log.md, issue 34's precision). A weight near
# 0 may then differ by a large share of itself (5.15e-6 against 5.13e-6), so each weight is held to
# SPARSE_RTOL of itself, or of SPARSE_RELATIVE_FLOOR of its vector's largest weight where it is smaller.
SPARSE_RTOL = 1e-4
SPARSE_RELATIVE_FLOOR = 1e-2


class ValidationFailedError(ExportError):
    """One or more enforced thresholds missed; the message lists each."""


def _sentences(name: str) -> list[str]:
    text = importlib.resources.files("export").joinpath(f"data/{name}").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def validation_sentences() -> list[str]:
    """The fixed parity set: Chinese sentences of 1 to 70 characters (news, reviews, titles, questions)."""
    return _sentences("validation_zh.txt")


def calibration_sentences() -> list[str]:
    """A different set of the same kinds, for int8 calibration: validating on it would flatter int8."""
    return _sentences("calibration_zh.txt")


@dataclass
class Batch:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    masked_ids: np.ndarray
    masked: np.ndarray  # bool [batch, seq]: positions replaced by [MASK]

    def feed(self, masked: bool = False) -> dict[str, np.ndarray]:
        ids = self.masked_ids if masked else self.input_ids
        return {
            "input_ids": ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


@dataclass
class Reference:
    """PyTorch's answers, per batch: every layer's hidden states, pooled vectors, masked-LM logits."""

    layers: list[list[np.ndarray]]  # [batch][layer-1] -> [b, s, h]
    pooler: list[np.ndarray | None]
    mlm_logits: list[np.ndarray | None]  # [masked positions, vocab]
    head_logits: list[np.ndarray | None]  # a fine-tuned head's logits: [b, labels] or [b, s, labels]
    sparse: list[np.ndarray] = field(default_factory=list)  # SPLADE's vectors [b, vocab], with --sparse


@dataclass(frozen=True)
class Checks:
    """What one model's graphs are checked for, besides every layer's states and cls/mean pooling."""

    modes: tuple[PooledMode, ...]  # the poolings the graph computes
    has_pooler: bool
    head_activation: str | None = None  # "softmax" | "sigmoid" | "identity" with a head
    token_head: bool = False
    # A sentence-transformers model's own pipeline: its pooling and Dense modules, checked end to end
    # (numpy Dense on the graph's pooled output against PyTorch's Dense on PyTorch's pooling).
    sentence_pooling: str | None = None
    dense: tuple[sentence.Dense, ...] = ()


def make_batches(tokenizer: PreTrainedTokenizerFast, sentences: list[str]) -> list[Batch]:
    rng = np.random.default_rng(SEED)
    batches = []
    for start in range(0, len(sentences), BATCH):
        enc = tokenizer(sentences[start : start + BATCH], padding=True, truncation=True, return_tensors="np")
        ids = enc["input_ids"].astype(np.int64)
        mask = enc["attention_mask"].astype(np.int64)
        special = np.isin(ids, [tokenizer.cls_token_id, tokenizer.sep_token_id]) | (mask == 0)
        masked = np.zeros_like(mask, dtype=bool)
        for row in range(ids.shape[0]):
            candidates = np.flatnonzero(~special[row])
            count = max(1, round(MASK_SHARE * len(candidates)))
            masked[row, rng.choice(candidates, size=count, replace=False)] = True
        masked_ids = np.where(masked, tokenizer.mask_token_id, ids)
        types = enc.get("token_type_ids", np.zeros_like(ids)).astype(np.int64)
        batches.append(Batch(ids, mask, types, masked_ids, masked))
    return batches


def torch_splade(logits: torch.Tensor, mask: torch.Tensor, sparse: Sparse) -> torch.Tensor:
    """SPLADE as sentence-transformers' SpladePooling computes it, in its order of operations: the
    reference the sparse graph (which pools first, export/graphs.py) is held to."""
    x = torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))
    if sparse.activation == "log1p_relu":
        x = torch.log1p(x)
    return x.amax(dim=1) if sparse.pooling == "max" else x.sum(dim=1)


@torch.no_grad()
def reference(loaded: LoadedModel, batches: list[Batch], sparse: Sparse | None = None) -> Reference:
    layers: list[list[np.ndarray]] = []
    splade: list[np.ndarray] = []
    pooler: list[np.ndarray | None] = []
    logits: list[np.ndarray | None] = []
    heads: list[np.ndarray | None] = []
    for b in batches:
        out = loaded.bert(**{k: torch.from_numpy(v) for k, v in b.feed().items()}, output_hidden_states=True)
        layers.append([h.numpy() for h in out.hidden_states[1:]])
        pooler.append(out.pooler_output.numpy() if loaded.has_pooler else None)
        if loaded.head is None:
            heads.append(None)
        elif loaded.head_architecture == "BertForTokenClassification":
            heads.append(loaded.head(out.last_hidden_state).numpy())
        else:
            heads.append(loaded.head(out.pooler_output).numpy())
        if loaded.mlm_head is None:
            logits.append(None)
            continue
        if sparse is not None:
            mask = torch.from_numpy(b.attention_mask)
            splade.append(torch_splade(loaded.mlm_head(out.last_hidden_state), mask, sparse).numpy())
        masked_out = loaded.bert(**{k: torch.from_numpy(v) for k, v in b.feed(masked=True).items()})
        hidden = masked_out.last_hidden_state[torch.from_numpy(b.masked)]
        logits.append(loaded.mlm_head(hidden).numpy())
    return Reference(layers, pooler, logits, heads, splade)


def _pooled(
    layer: np.ndarray, mask: np.ndarray, modes: tuple[PooledMode, ...]
) -> dict[PooledMode, np.ndarray]:
    """PyTorch's side of the pooled outputs: its hidden states [batch, seq, hidden], pooled in numpy."""
    return {mode: np_pooling.pool(mode, layer, mask) for mode in modes}


def _torch_sentence(layer: np.ndarray, mask: np.ndarray, checks: Checks) -> np.ndarray:
    pooled = np_pooling.pool(str(checks.sentence_pooling), layer, mask)
    return sentence.torch_dense(torch.from_numpy(pooled), checks.dense).numpy()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row; two all-zero rows agree (1), one all-zero row against another does not (0)."""
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    both_zero = ~a.any(axis=-1) & ~b.any(axis=-1)
    return np.where(both_zero, 1.0, (a * b).sum(-1) / np.where(norms > 0, norms, np.inf))


def _topk(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-logits, axis=-1)[:, :k]


def measure_sessions(
    num_layers: int,
    checks: Checks,
    batches: list[Batch],
    ref: Reference,
    encoder: ort.InferenceSession,
    head: ort.InferenceSession | None,
    splade: ort.InferenceSession | None = None,
) -> dict[str, float]:
    """The raw metrics of one variant's sessions against the reference."""
    layers = [layer_output_name(i, num_layers) for i in range(1, num_layers + 1)]
    pooled = {
        (mode, i): pooled_output_name(mode, i, num_layers)
        for mode in checks.modes
        for i in range(1, num_layers + 1)
    }
    vectors = [*pooled.values(), *([POOLER_OUTPUT] if checks.has_pooler else [])]
    names = [*layers, *vectors, *([HEAD_OUTPUT] if checks.head_activation else [])]
    cosines: dict[str, list[np.ndarray]] = {name: [] for name in vectors}
    sentence_cosines: list[np.ndarray] = []
    # The service's Dense modules (app/model/dense.py), as it runs them on the graph's pooled output.
    dense = tuple(np_dense.dense(d.weight, d.bias, d.activation) for d in checks.dense)
    max_abs = head_abs = 0.0
    top1: list[np.ndarray] = []
    top5: list[float] = []
    sparse_pairs: list[tuple[np.ndarray, np.ndarray]] = []
    for i, b in enumerate(batches):
        got = dict(zip(names, encoder.run(names, b.feed()), strict=True))
        real = b.attention_mask.astype(bool)
        for layer in range(num_layers):
            diff = np.abs(got[layers[layer]] - ref.layers[i][layer])[real]
            max_abs = max(max_abs, float(diff.max()))
            for mode, theirs in _pooled(ref.layers[i][layer], b.attention_mask, checks.modes).items():
                mine = got[pooled[mode, layer + 1]]
                max_abs = max(max_abs, float(np.abs(mine - theirs).max()))
                cosines[pooled[mode, layer + 1]].append(_cosines(mine, theirs))
        if checks.has_pooler:
            cosines[POOLER_OUTPUT].append(_cosines(got[POOLER_OUTPUT], ref.pooler[i]))  # type: ignore[arg-type]
        if checks.sentence_pooling is not None:
            own = pooled_output_name(checks.sentence_pooling, num_layers, num_layers)  # type: ignore[arg-type]
            mine = np_dense.apply(got[own], dense)
            sentence_cosines.append(
                _cosines(mine, _torch_sentence(ref.layers[i][-1], b.attention_mask, checks))
            )
        ref_head = ref.head_logits[i]
        if checks.head_activation is not None and ref_head is not None:
            mine, theirs = (head_scores(x, checks.head_activation) for x in (got[HEAD_OUTPUT], ref_head))
            diff = np.abs(mine - theirs)
            head_abs = max(head_abs, float((diff[real] if checks.token_head else diff).max()))
        ref_logits = ref.mlm_logits[i]
        if head is not None and ref_logits is not None:
            hidden = encoder.run([LAST_HIDDEN_STATE], b.feed(masked=True))[0][b.masked]
            logits = head.run(None, {MLM_INPUT: hidden})[0]
            a, t = _topk(logits, 5), _topk(ref_logits, 5)
            top1.append(a[:, 0] == t[:, 0])
            top5.extend(len(set(x) & set(y)) / 5 for x, y in zip(a.tolist(), t.tolist(), strict=True))
        if splade is not None and ref.sparse:
            feed = dict(zip(SPARSE_INPUTS, (got[LAST_HIDDEN_STATE], b.attention_mask), strict=True))
            sparse_pairs.append((splade.run([SPARSE_OUTPUT], feed)[0], ref.sparse[i]))
    per_output = {name: np.concatenate(c) for name, c in cosines.items()}
    all_cos = np.concatenate(list(per_output.values()))
    metrics = {
        "cosine_min": float(all_cos.min()),
        "cosine_mean": float(all_cos.mean()),
        "max_abs_diff": max_abs,
    }
    if sentence_cosines:
        metrics["sentence_cosine_min"] = float(np.concatenate(sentence_cosines).min())
    if checks.head_activation is not None:
        metrics["head_score_max_abs_diff"] = head_abs
    if top1:
        metrics["mlm_top1"] = float(np.concatenate(top1).mean())
        metrics["mlm_top5"] = float(np.mean(top5))
    if sparse_pairs:
        metrics.update(sparse_metrics(*(np.concatenate(x) for x in zip(*sparse_pairs, strict=True))))
    metrics.update(
        {f"cosine_min{PER_OUTPUT}{name}": float(per_output[name].min()) for name in pooled.values()}
    )
    return metrics


def sparse_metrics(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """The sparse graph's vectors ``got`` against PyTorch's ``want`` [sentences, vocab]: the least cosine;
    the largest difference relative to the weight, over weights of at least ``SPARSE_FLOOR`` (smaller ones
    sit at float32's rounding of a logit near 0); the share of sentences whose weights of at least that
    floor are on the same indices; the least overlap of the 64 largest weights' indices."""
    cos = _cosines(got, want)
    big = want >= SPARSE_FLOOR
    rel = np.abs(got - want)[big] / want[big]
    same = [np.array_equal(g >= SPARSE_FLOOR, w) for g, w in zip(got, big, strict=True)]
    k = min(64, want.shape[1])
    overlap = [
        len(set(x) & set(y)) / k for x, y in zip(_topk(got, k).tolist(), _topk(want, k).tolist(), strict=True)
    ]
    return {
        "sparse_cosine_min": float(cos.min()),
        "sparse_max_rel_diff": float(rel.max(initial=0.0)),
        "sparse_same_indices": float(np.mean(same)),
        "sparse_top64_overlap_min": float(min(overlap)),
    }


def sparse_agreement(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """fp32 SPLADE vectors ``got`` against ``want`` [sentences, vocab], as the tests hold /embed_sparse to
    SparseEncoder.encode:

    - ``max_rel_diff``: each weight's difference over the larger of the weight and
      ``SPARSE_RELATIVE_FLOOR`` × its vector's largest (at most ``SPARSE_RTOL`` to agree);
    - ``max_rel_diff_above_1e-3``: over the weight itself, for weights of at least ``SPARSE_FLOOR``;
    - ``max_diff_of_max``: the largest difference over its vector's largest weight;
    - ``rtol_floor_of_max``: the largest weight (over its vector's largest) differing by more than
      ``SPARSE_RTOL`` of itself: every weight above that share of its vector's largest is within it;
    - ``same_nonzero_share``: the share of sentences whose non-zero weights are on the same indices (the
      model's threshold: relu's 0); ``index_mismatches``: the indices non-zero on one side only, in all,
      and ``mismatch_weight_of_max`` the largest such weight over its vector's largest (0 with none).
    """
    top = want.max(axis=1, keepdims=True)
    diff = np.abs(got.astype(np.float64) - want)
    floor = np.maximum(want, SPARSE_RELATIVE_FLOOR * top)
    rel = np.divide(diff, floor, out=np.zeros_like(diff), where=floor > 0)
    big = want >= SPARSE_FLOOR
    off = diff > SPARSE_RTOL * want
    of_top = np.divide(want, top, out=np.zeros_like(diff), where=top > 0)
    mismatch = (got > 0) != (want > 0)
    stray = np.where(mismatch, np.maximum(got, want), 0.0)
    of_max = np.divide(stray, top, out=np.zeros_like(stray), where=top > 0)
    return {
        "max_rel_diff": float(rel.max(initial=0.0)),
        "max_rel_diff_above_1e-3": float((diff[big] / want[big]).max(initial=0.0)),
        "max_diff_of_max": float(np.divide(diff, top, out=np.zeros_like(diff), where=top > 0).max()),
        "rtol_floor_of_max": float(of_top[off].max(initial=0.0)),
        "same_nonzero_share": float(np.mean(~mismatch.any(axis=1))),
        "index_mismatches": float(mismatch.sum()),
        "mismatch_weight_of_max": float(of_max.max(initial=0.0)),
    }


def judge(
    variant: Variant,
    provider: str,
    sentences: int,
    raw: dict[str, float],
    weights: str,
    thresholds: dict[Variant, tuple[Threshold, ...]] = THRESHOLDS,
) -> Validation:
    """Attach thresholds to raw metrics; ``passed`` is false if any enforced one missed."""
    metrics: dict[str, Metric] = {}
    by_name = {t.metric: t for t in thresholds.get(variant, ())}
    for name, value in raw.items():
        t = by_name.get(name) or by_name.get(name.partition(PER_OUTPUT)[0])
        if t is None:
            metrics[name] = Metric(value=value, threshold=None, op=None, enforced=False, passed=True)
            continue
        ok = value >= t.value if t.op == ">=" else value <= t.value
        enforced = t.on_random or weights == "pretrained"
        metrics[name] = Metric(value=value, threshold=t.value, op=t.op, enforced=enforced, passed=ok)  # type: ignore[arg-type]
    passed = all(m.passed or not m.enforced for m in metrics.values())
    return Validation(variant=variant, provider=provider, sentences=sentences, metrics=metrics, passed=passed)


def failures(results: list[Validation]) -> list[str]:
    """One line per enforced metric that missed, across every variant."""
    return [
        f"{v.variant} {name} = {m.value:.6g} (needs {m.op} {m.threshold:g})"
        for v in results
        for name, m in v.metrics.items()
        if m.enforced and not m.passed
    ]


def session(path: Path, provider: str) -> ort.InferenceSession:
    providers = [provider, "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
    available = ort.get_available_providers()
    return ort.InferenceSession(str(path), providers=[p for p in providers if p in available])
