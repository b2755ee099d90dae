"""int8 with per-token activation scales: the graph rewrite behind the default int8 recipe.

ONNX Runtime's ``quantize_dynamic`` quantises each MatMul's activations with ONE scale for the whole
batch tensor. Two things follow, both bad for an embedding service:

- a few outlier tokens ([CLS]/[SEP] carry huge activations in BERT) set the range for every token, so short
  texts lose precision: all-MiniLM-L6-v2's mean-pooled cosine to fp32 drops to 0.85 (0.97 per-channel);
- a text's vector depends on which other texts share its batch, so batching and the cache disagree.

Here every token row gets its own scale (and, with 128 levels, its own zero point; with 256 all rows share
the middle level as zero point: see ``LEVELS_VNNI``), weights get one symmetric int8 scale per output
channel, and the product runs as ``MatMulIntegerToFloat`` (uint8 × int8 → int32, weight scales applied on
the way out) on the CPU's integer units (VNNI/AMX where present), which also takes out the zero point (as
its scalar a_zero_point, or per row by ``_zero_point_rows``): after it, one Mul by the row scales. A
token's result depends on that token alone. The word-embedding table is stored int8 with one scale per row.

A GEMM whose output is only max-pooled over the sequence (the sparse graph's vocabulary projection, whose
[batch, seq, vocab] output is the largest tensor of any graph here) quantises each sequence with one scale
instead: a positive scale commutes with the max, so the scales' Mul runs on the pooled [batch, vocab]
rows rather than on every token's (the same bits as scaling first). A sequence's result still depends on
that sequence alone (its padded positions repeat a real token's state: ``export/graphs.py`` ``_Splade``).

Per-token scales still suffer from BERT's few outlier channels, so first each MatMul's input channels are
smoothed (:mod:`export.smoothquant`, from a calibration set).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.smoothquant import gemm_to_matmul, smooth

# Guards the per-token scale of an all-zero row (scale 0 would make 0/0 = NaN).
EPS = 1e-12
QMAX = 127.0
# Activation levels. x86 CPUs without VNNI (AVX2, plain AVX-512) multiply u8 x s8 with VPMADDUBSW, which
# adds adjacent products into a saturating int16: with 256 levels and 8-bit weights 2 x 255 x 127 overflows
# and MatMulInteger is silently wrong (60% of the outputs of a random [64, 48] x [48, 64] product, measured
# on an AVX2 EPYC). 2 x 127 x 127 fits, so 128 levels are exact everywhere. VNNI (VPDPBUSD) accumulates
# u8 x s8 in int32 and is exact with all 256; a graph made with 256 is only for such CPUs (the manifest
# says so and app/model/runtime.py refuses it elsewhere).
LEVELS_ANY_CPU = 128
LEVELS_VNNI = 256


@dataclass(frozen=True)
class _Rows:
    """One tensor quantised by rows, as every GEMM that reads it takes it (``_Rewriter._quantize_rows``)."""

    q: str  # uint8 [..., width + pieces]: the rows, then `pieces` copies of the row's zero point
    scale: str  # float [..., 1]
    pieces: int  # 0 with the shared zero point (``LEVELS_VNNI``), which the GEMM takes as its a_zero_point


def _namer(prefix: str) -> tuple[Callable[..., onnx.NodeProto], Callable[[str], str]]:
    """``n(op, inputs, out, **attrs)``: a node whose output is ``prefix.out``; ``p(name)``: ``prefix.name``."""

    def n(op: str, inputs: list[str], out: str, **attrs: Any) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [f"{prefix}.{out}"], **attrs)

    def p(name: str) -> str:
        return f"{prefix}.{name}"

    return n, p


def _per_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.maximum(np.abs(weight).max(axis=0), EPS) / QMAX
    q = np.clip(np.rint(weight / scale), -QMAX, QMAX).astype(np.int8)
    return q, scale.astype(np.float32)


def _zero_point_rows(colsum: np.ndarray, pieces: int) -> np.ndarray:
    """``pieces`` int8 rows that add up to ``-colsum`` column by column, each entry within ±QMAX.

    Appended under the weights, they meet ``pieces`` copies of the row's zero point appended to the
    activation rows, so the GEMM itself computes Σ_k x_q·w - zp·Σ_k w: the zero point costs no pass over
    the output. Every pair a u8×s8 instruction adds stays within 2 x 127 x 127 (exact without VNNI).
    """
    target = -colsum.astype(np.int64)
    base, rest = np.divmod(target, pieces)  # rest in [0, pieces): that many pieces get base + 1
    rows = np.repeat(base[None, :], pieces, axis=0) + (np.arange(pieces)[:, None] < rest[None, :])
    if np.abs(rows).max(initial=0) > QMAX:
        raise ValueError(f"{pieces} pieces cannot hold a column sum of {np.abs(target).max()}")
    return rows.astype(np.int8)


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, levels: int) -> None:
        self.model = model
        self.graph = model.graph
        self.inits = {i.name: i for i in self.graph.initializer}
        self.new_inits: list[onnx.TensorProto] = []
        self.count = 0
        # Input tensor -> its quantised rows, so readers of one tensor (Q, K, V) quantise it once.
        self.quantized: dict[tuple[str, bool], _Rows] = {}
        self.weights = {
            n.output[0]: _per_channel(numpy_helper.to_array(self.inits[n.input[1]]))
            for n in self.graph.node
            if n.op_type == "MatMul" and self._quantizable(n.input[1])
        }
        # GEMM outputs read only by a max over the sequence: quantised per sequence; their row scales,
        # by output, for the rewrite of that max.
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        outputs = {o.name for o in self.graph.output}
        self.pooled = {
            out
            for out in self.weights
            if out not in outputs and [self._pools_sequence(r) for r in readers.get(out, [])] == [True]
        }
        self.pooled_scale: dict[str, str] = {}
        # 256 levels: one zero point for all rows, the middle level (``_rows_shared_zero_point``); 128: each
        # row its own, taken out by pieces appended to the rows, enough for the largest column sum of any
        # weight reading that input.
        self.shared_zero_point = levels == LEVELS_VNNI
        self.pieces: dict[str, int] = {}
        for node in self.graph.node:
            if node.output[0] in self.weights and not self.shared_zero_point:
                q = self.weights[node.output[0]][0]
                need = int(np.ceil(np.abs(q.astype(np.int64).sum(axis=0)).max() / QMAX))
                self.pieces[node.input[0]] = max(self.pieces.get(node.input[0], 1), need)
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        self.axes_as_input = opset >= 18
        self._const("zq.eps", np.array(EPS, dtype=np.float32))
        if self.shared_zero_point:
            zero_point = levels // 2
            self._const("zq.zp", np.array(zero_point, dtype=np.uint8))
            self._const("zq.zp_vec", np.array([zero_point], dtype=np.uint8))
            self._const("zq.top", np.array(levels - 1 - zero_point, dtype=np.float32))
            self._const("zq.bottom", np.array(-zero_point, dtype=np.float32))
        else:
            self._const("zq.zerof", np.array(0.0, dtype=np.float32))
            self._const("zq.levels", np.array(levels - 1, dtype=np.float32))
        self._const("zq.one", np.array(1.0, dtype=np.float32))
        self._const("zq.flat", np.array([-1], dtype=np.int64))
        self._const("zq.column", np.array([-1, 1], dtype=np.int64))
        if self.axes_as_input:
            self._const("zq.axes", np.array([-1], dtype=np.int64))
            self._const("zq.seq_axes", np.array([1, 2], dtype=np.int64))

    def _pools_sequence(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` is a ReduceMax over axis 1 (the sequence of [batch, seq, width]) alone."""
        if node.op_type != "ReduceMax":
            return False
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes = attrs.get("axes")
        if len(node.input) > 1 and node.input[1] in self.inits:
            axes = numpy_helper.to_array(self.inits[node.input[1]]).tolist()
        return axes == [1] and attrs.get("keepdims", 1) == 0

    def _quantizable(self, name: str) -> bool:
        weight = self.inits.get(name)
        return weight is not None and len(weight.dims) == 2 and weight.data_type == TensorProto.FLOAT

    def _const(self, name: str, value: np.ndarray) -> str:
        self.new_inits.append(numpy_helper.from_array(value, name))
        return name

    def _row_extremes(
        self, x: str, n: Callable[..., onnx.NodeProto], per_sequence: bool
    ) -> tuple[onnx.NodeProto, onnx.NodeProto]:
        """The ReduceMax and ReduceMin over the last axis of ``x``, or over a sequence's tokens and width
        (axes as an input from opset 18 on)."""
        if self.axes_as_input:
            axes = "zq.seq_axes" if per_sequence else "zq.axes"
            return n("ReduceMax", [x, axes], "max", keepdims=1), n("ReduceMin", [x, axes], "min", keepdims=1)
        over = [1, 2] if per_sequence else [-1]
        return n("ReduceMax", [x], "max", axes=over, keepdims=1), n(
            "ReduceMin", [x], "min", axes=over, keepdims=1
        )

    def _rows_shape(self, p: Callable[[str], str], width: int, per_sequence: bool) -> str:
        """The shape that makes ``x`` rows of one scale each: its tokens, or its sequences."""
        return self._const(
            p("rows_shape"), np.array([0, -1] if per_sequence else [-1, width], dtype=np.int64)
        )

    def _rows_shared_zero_point(
        self, x: str, prefix: str, width: int, per_sequence: bool
    ) -> tuple[list[onnx.NodeProto], _Rows]:
        """Nodes that turn float ``x`` [..., width] into uint8 rows, each with its own scale and all with one
        zero point, the middle level: the 256-level (VNNI) graph.

        MatMulIntegerToFloat takes a scalar zero point and subtracts it inside its kernel, so nothing is
        appended to the rows (``_rows_own_zero_point`` does): a copy pass over them less, and no extra
        columns in the GEMM (-6% kernel time on the twin, b8 s48). Row r maps [-zp, top]·scale_r, so its
        scale is the larger of max/top and min/-zp: a one-sided row uses half the levels, which costs
        all-MiniLM-L6-v2 0.0003 of worst pooled cosine with 256 levels but 0.005 with 128 (0.9921 against
        0.9969), hence only with 256.
        """
        n, p = _namer(prefix)
        reduce_max, reduce_min = self._row_extremes(x, n, per_sequence)
        rows_shape = self._rows_shape(p, width, per_sequence)
        nodes = [
            reduce_max,
            reduce_min,
            n("Div", [p("max"), "zq.top"], "up"),
            n("Div", [p("min"), "zq.bottom"], "down"),
            n("Max", [p("up"), p("down")], "fit"),
            n("Max", [p("fit"), "zq.eps"], "scale"),  # never 0: an all-zero row would give 0/0
            n("Reshape", [p("scale"), "zq.flat"], "scale_rows"),
            # Per-axis QuantizeLinear wants a zero point per row: the one zero point, [rows] times.
            n("Shape", [p("scale_rows")], "rows"),
            n("Expand", ["zq.zp_vec", p("rows")], "zp_rows"),
            n("Reshape", [x, rows_shape], "x_rows"),
            n("QuantizeLinear", [p("x_rows"), p("scale_rows"), p("zp_rows")], "q_rows", axis=0),
            n("Shape", [x], "x_shape"),
            n("Reshape", [p("q_rows"), p("x_shape")], "q"),
        ]
        return nodes, _Rows(p("q"), p("scale"), 0)

    def _rows_own_zero_point(
        self, x: str, prefix: str, width: int, per_sequence: bool
    ) -> tuple[list[onnx.NodeProto], _Rows]:
        """Nodes that turn float ``x`` [..., width] into uint8 rows, each with its own scale and zero point,
        followed by ``pieces`` copies of that zero point (``_zero_point_rows`` says why): the 128-level graph.

        Asymmetric, so a one-sided row (GELU's output is >= -0.17) uses all the levels, not half of them.
        The scale and zero point come from two row reductions; the rows are then quantised by one per-axis
        ``QuantizeLinear`` over ``x`` seen as [rows, width] (round half to even, saturating: the same bytes
        as Div, Round, Add, Clip and Cast, in one pass instead of five: 2.9x faster on [512, 3072]).
        """
        pieces = self.pieces[x]
        n, p = _namer(prefix)
        reduce_max, reduce_min = self._row_extremes(x, n, per_sequence)
        rows_shape = self._rows_shape(p, width, per_sequence)
        nodes = [
            reduce_max,
            reduce_min,
            # The range must hold 0 exactly (zero padding, ReLU-like rows) and never be empty.
            n("Max", [p("max"), "zq.zerof"], "hi"),
            n("Min", [p("min"), "zq.zerof"], "lo"),
            n("Sub", [p("hi"), p("lo")], "range"),
            n("Max", [p("range"), "zq.eps"], "rangec"),
            n("Div", [p("rangec"), "zq.levels"], "scale"),
            n("Div", [p("lo"), p("scale")], "lo_q"),
            n("Neg", [p("lo_q")], "zp_raw"),
            n("Round", [p("zp_raw")], "zp"),  # in [0, levels - 1]: lo <= 0 <= hi
            n("Cast", [p("zp")], "zp_u8", to=TensorProto.UINT8),
            n("Reshape", [p("scale"), "zq.flat"], "scale_rows"),
            n("Reshape", [p("zp_u8"), "zq.flat"], "zp_rows"),
            n("Reshape", [x, rows_shape], "x_rows"),
            n("QuantizeLinear", [p("x_rows"), p("scale_rows"), p("zp_rows")], "q_rows", axis=0),
        ]
        if per_sequence:  # each token followed by its sequence's zero point
            rep_shape = self._const(p("pieces"), np.array([pieces], np.int64))
            nodes += [
                n("Shape", [x], "x_shape"),
                n("Reshape", [p("q_rows"), p("x_shape")], "q_tokens"),
                n("Shape", [x], "lead", end=-1),
                n("Concat", [p("lead"), rep_shape], "rep_shape", axis=0),
                n("Expand", [p("zp_u8"), p("rep_shape")], "zp_rep"),
                n("Concat", [p("q_tokens"), p("zp_rep")], "q", axis=-1),
            ]
            return nodes, _Rows(p("q"), p("scale"), pieces)
        wide = self._const(p("wide"), np.array([width + pieces], dtype=np.int64))
        repeat = self._const(p("repeat"), np.array([1, pieces], dtype=np.int64))
        nodes += [
            n("Reshape", [p("zp_u8"), self._const(p("col"), np.array([-1, 1], dtype=np.int64))], "zp_col"),
            n("Expand", [p("zp_col"), repeat], "zp_rep"),
            n("Concat", [p("q_rows"), p("zp_rep")], "q_wide", axis=1),
            n("Shape", [x], "lead", end=-1),
            n("Concat", [p("lead"), wide], "wide_shape", axis=0),
            n("Reshape", [p("q_wide"), p("wide_shape")], "q"),
        ]
        return nodes, _Rows(p("q"), p("scale"), pieces)

    def matmul(self, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        if node.output[0] not in self.weights:
            return None
        q, w_scale = self.weights[node.output[0]]
        prefix = f"zq{self.count}"
        self.count += 1
        nodes: list[onnx.NodeProto] = []
        per_sequence = node.output[0] in self.pooled
        key = (node.input[0], per_sequence)
        if key in self.quantized:
            rows = self.quantized[key]
        else:
            quantize = self._rows_shared_zero_point if self.shared_zero_point else self._rows_own_zero_point
            nodes, rows = quantize(node.input[0], prefix, q.shape[0], per_sequence)
            self.quantized[key] = rows
        # y = scale·(Σ_k (x_q - zp)·w): MatMulIntegerToFloat takes the zero point out inside the GEMM (as its
        # scalar a_zero_point, or by the rows appended to both sides) and applies the weight scales in its
        # output stage; the row scale is one Mul. The bias Add after it stays, for ONNX Runtime to fuse into
        # BiasGelu.
        if rows.pieces:
            q = np.concatenate([q, _zero_point_rows(q.astype(np.int64).sum(axis=0), rows.pieces)])
        inputs = [rows.q, self._const(f"{prefix}.w", q), "zq.one", self._const(f"{prefix}.wscale", w_scale)]
        if not rows.pieces:
            inputs.append("zq.zp")
        if per_sequence:  # unscaled: the max over the sequence is scaled after it (``pooled_max``)
            self.pooled_scale[node.output[0]] = rows.scale
            gemm = helper.make_node("MatMulIntegerToFloat", inputs, [node.output[0]], domain="com.microsoft")
            return [*nodes, gemm]
        product = f"{prefix}.product"
        gemm = helper.make_node("MatMulIntegerToFloat", inputs, [product], domain="com.microsoft")
        return [*nodes, gemm, helper.make_node("Mul", [product, rows.scale], [node.output[0]])]

    def pooled_max(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """The max over the sequence of an unscaled per-sequence GEMM, then its sequences' scales."""
        scale = self.pooled_scale[node.input[0]]
        unscaled, column = f"{scale}.pooled", f"{scale}.column"
        pool = onnx.NodeProto()
        pool.CopyFrom(node)
        pool.output[0] = unscaled
        return [
            pool,
            helper.make_node("Reshape", [scale, "zq.column"], [column]),  # [batch, 1, 1] -> [batch, 1]
            helper.make_node("Mul", [unscaled, column], [node.output[0]]),
        ]

    def gather(self, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        table = self.inits.get(node.input[0])
        if table is None or len(table.dims) != 2 or table.data_type != TensorProto.FLOAT:
            return None
        values = numpy_helper.to_array(table)
        # One scale per row (per vocabulary entry): the transpose of per-channel.
        q, row_scale = _per_channel(values.T)
        prefix = f"zq{self.count}"
        self.count += 1
        tq = self._const(f"{prefix}.table", np.ascontiguousarray(q.T))
        ts = self._const(f"{prefix}.rowscale", row_scale.reshape(-1, 1))
        rows, rowsf, scales = f"{prefix}.rows", f"{prefix}.rowsf", f"{prefix}.scales"
        return [
            helper.make_node("Gather", [tq, node.input[1]], [rows], axis=0),
            helper.make_node("Cast", [rows], [rowsf], to=TensorProto.FLOAT),
            helper.make_node("Gather", [ts, node.input[1]], [scales], axis=0),
            helper.make_node("Mul", [rowsf, scales], [node.output[0]]),
        ]

    def run(self) -> int:
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            new = None
            if node.op_type == "MatMul":
                new = self.matmul(node)
            elif (
                node.op_type == "Gather" and node.input[0] in self.inits and self._is_big_table(node.input[0])
            ):
                new = self.gather(node)
            elif node.op_type == "ReduceMax" and node.input and node.input[0] in self.pooled_scale:
                new = self.pooled_max(node)
            if new is None:
                nodes.append(node)
                continue
            nodes.extend(new)
        still_used = {i for n in nodes for i in n.input} | {o.name for o in self.graph.output}
        kept = [i for i in [*self.graph.initializer, *self.new_inits] if i.name in still_used]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        return self.count

    def _is_big_table(self, name: str) -> bool:
        # The word embeddings: position and token-type tables are small and stay fp32.
        dims = self.inits[name].dims
        return len(dims) == 2 and dims[0] >= 1000


def quantize_per_token(
    src: Path,
    dst: Path,
    absmax: dict[str, np.ndarray] | None = None,
    alpha: float = 0.5,
    levels: int = LEVELS_ANY_CPU,
) -> int:
    """Rewrite every constant-weight MatMul (and the word-embedding Gather) of ``src`` into int8.

    Args:
        absmax: calibration maxima from ``smoothquant.calibrate``; when given, inputs are smoothed first.
        alpha: SmoothQuant's migration strength (0: all in activations, 1: all in weights).
        levels: activation levels per row: ``LEVELS_ANY_CPU``, or ``LEVELS_VNNI`` for CPUs with VNNI only.

    Returns:
        How many nodes were quantised.
    """
    model = gemm_to_matmul(onnx.load(str(src)))
    if absmax:
        smooth(model, absmax, alpha)
    count = _Rewriter(model, levels).run()
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return count
