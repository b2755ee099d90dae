"""The export stage's contract as data: variants, their recipes and providers, and parity thresholds.

Everything else in ``export/`` reads these tables; changing a threshold or a recipe is a one-line edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.model.manifest import ANY_CPU, VNNI, Variant
from app.model.runtime import cpu_has_vnni

DEFAULT_OPSET = 17
DEFAULT_MODEL = "bert-base-chinese"
# Seed for a twin's random weights and for picking masked positions during validation.
SEED = 1234

PROVIDERS: dict[Variant, str] = {
    "fp32": "CPUExecutionProvider",
    "fp16": "CUDAExecutionProvider",
    "int8": "CPUExecutionProvider",
}


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 graph is made. Compared by ``python -m loadtest.int8_recipes`` (docs/export.md).

    ``per_token`` (export/quantize.py): SmoothQuant-calibrated, per-token asymmetric activations, per-channel
    weights; a token's vector does not depend on its batch. ``dynamic``: onnxruntime's quantize_dynamic,
    one activation scale per batch tensor.
    """

    method: Literal["per_token", "dynamic"] = "per_token"
    # per_token: SmoothQuant's migration strength; 0.5 measured best on all-MiniLM-L6-v2.
    alpha: float = 0.5
    # dynamic: fuse with onnxruntime.transformers' BERT optimizer first (Attention -> QAttention).
    fused: bool = False
    # dynamic: one weight scale per output channel instead of per tensor.
    per_channel: bool = False
    # per_token: the CPUs the graph is for. "vnni": 256 activation levels, exact only with VNNI; "any": 128,
    # exact on every x86-64 (export/quantize.py, LEVELS_VNNI); "auto": "vnni" when the exporting CPU has it.
    cpu: Literal["auto", "vnni", "any"] = "auto"

    def target_cpu(self) -> str:
        """``VNNI`` or ``ANY_CPU``: "auto" resolved on the CPU this runs on."""
        if self.cpu == "auto":
            return VNNI if cpu_has_vnni() else ANY_CPU
        return VNNI if self.cpu == "vnni" else ANY_CPU

    def act_levels(self) -> int:
        return 256 if self.target_cpu() == VNNI else 128

    def describe(self) -> dict[str, str | bool | int]:
        if self.method == "per_token":
            return {
                "method": self.method,
                "alpha_pct": round(self.alpha * 100),
                "weights": "per_channel",
                "act_levels": self.act_levels(),
                "cpu": self.target_cpu(),
                # The graph rewrite's version: 2 quantises rows with one per-axis QuantizeLinear, into
                # 128 levels (exact on CPUs without VNNI; export/quantize.py, LEVELS_VNNI); 3 runs the
                # GEMMs as MatMulIntegerToFloat; 4 takes the zero point out inside the GEMM and leaves the
                # bias Add to ONNX Runtime's fusions, and chooses 256 levels for VNNI CPUs; 5 gives the rows of
                # a 256-level graph one shared zero point (the middle level), the GEMM's scalar a_zero_point,
                # and leaves GELU's outputs unsmoothed.
                "rewrite": 5,
            }
        return {"method": self.method, "fused": self.fused, "per_channel": self.per_channel}


INT8_RECIPE = Int8Recipe()


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str  # ">=" or "<="
    value: float
    # Enforced on random weights too? int8 error on random weights means nothing, so not for int8.
    on_random: bool = True


# A miss on an enforced threshold fails the export, listing every failing metric in one message.
THRESHOLDS: dict[Variant, tuple[Threshold, ...]] = {
    "fp32": (
        Threshold("cosine_min", ">=", 0.99999),
        Threshold("max_abs_diff", "<=", 1e-3),
        Threshold("mlm_top1", ">=", 1.0),
        # A sentence-transformers model's own vector (pooling + Dense) and a fine-tuned head's scores.
        Threshold("sentence_cosine_min", ">=", 0.99999),
        Threshold("head_score_max_abs_diff", "<=", 1e-4),
        Threshold("sparse_cosine_min", ">=", 0.99999),
    ),
    "fp16": (
        Threshold("cosine_min", ">=", 0.999),
        Threshold("sentence_cosine_min", ">=", 0.999),
        Threshold("head_score_max_abs_diff", "<=", 1e-2),
        Threshold("sparse_cosine_min", ">=", 0.999),
    ),
    "int8": (
        Threshold("cosine_min", ">=", 0.99, on_random=False),
        Threshold("sentence_cosine_min", ">=", 0.99, on_random=False),
        Threshold("head_score_max_abs_diff", "<=", 0.1, on_random=False),
        Threshold("sparse_cosine_min", ">=", 0.99, on_random=False),
    ),
}

# bert-base-chinese's published config.json, used to build its shape twin where the hub is unreachable.
BERT_BASE_CHINESE_CONFIG: dict[str, object] = {
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "directionality": "bidi",
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "pooler_fc_size": 768,
    "pooler_num_attention_heads": 12,
    "pooler_num_fc_layers": 3,
    "pooler_size_per_head": 128,
    "pooler_type": "first_token_transform",
    "type_vocab_size": 2,
    "vocab_size": 21128,
}
BERT_BASE_CHINESE_VOCAB_SHA256 = "45bbac6b341c319adc98a532532882e91a9cefc0329aa57bac9ae761c27b291c"
