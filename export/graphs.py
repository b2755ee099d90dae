"""Stage 2: PyTorch → fp32 ONNX graphs.

Two graphs serve every endpoint. The encoder returns each layer's hidden state as its own output (the
service fetches only the ones a batch needs), the pooler, and each layer's pooled vectors ``cls_{i}`` and
``mean_{i}`` [batch, hidden]: a pooled batch leaves the device as [batch, hidden], not [batch, seq, hidden]
(bert-base, batch 32 × 256 tokens: 98 KB instead of 25 MB per layer). The masked-LM head is a separate
small graph ``[k, hidden] → [k, vocab]`` so fill-mask runs it on [MASK] positions only. With ``--sparse``,
a third graph runs the same head on every token and pools SPLADE's weights inside it (:class:`_Splade`):
``[batch, seq, hidden] → [batch, vocab]``, so the [batch, seq, vocab] logits never leave the graph.

The pooling is elementwise (Mul, ReduceSum, Div, Clip; Gather for [CLS]), never a MatMul: the int8 rewrite
quantises MatMuls, and pooling must stay exact float. ``pooling_nodes`` finds its nodes by the outputs they
produce, so the fp16 conversion keeps them float32 and the dynamic int8 recipe leaves them alone.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch

from app.model.manifest import (
    ALWAYS_POOLED,
    HEAD_OUTPUT,
    INPUT_NAMES,
    LAST_HIDDEN_STATE,
    MLM_INPUT,
    MLM_OUTPUT,
    POOLED_MODES,
    POOLER_OUTPUT,
    SPARSE_INPUTS,
    SPARSE_OUTPUT,
    PooledMode,
    Sparse,
    TensorSpec,
    layer_output_name,
    pooled_output_name,
)
from export.source import LoadedModel

BATCH_SEQ = ["batch", "sequence"]
# The only operators a pooled output may be computed with (``pooling_nodes`` checks): elementwise float
# arithmetic, reductions and indexing. No MatMul/Gemm/einsum, which the int8 passes would quantise.
POOLING_OPS = frozenset(
    {"Gather", "Mul", "ReduceSum", "Div", "Clip", "Max", "Cast", "Unsqueeze", "Squeeze", "Constant"}
    # A sentence-transformers model's own mode (max, mean_sqrt_len, weightedmean, lasttoken) adds these.
    | {"ReduceMax", "Where", "Equal", "Sqrt", "Sub", "Add", "Range", "Shape", "Expand", "Reshape"}
    | {"GatherElements", "ConstantOfShape", "Slice", "Concat"}
)


class _Pooling(torch.nn.Module):
    """Each layer's pooled vectors, exactly as app/engine/pooling.py computes them in numpy: [CLS]; the
    mean over real tokens (sum of hidden × mask over max(mask sum, 1)); and for a sentence-transformers
    model its own mode (``modes``). A submodule, so that its nodes are named ``/pooling/...`` in the
    exported graph."""

    def __init__(self, modes: tuple[PooledMode, ...]) -> None:
        super().__init__()
        self.modes = modes

    def forward(
        self, layers: tuple[torch.Tensor, ...], attention_mask: torch.Tensor
    ) -> list[list[torch.Tensor]]:
        weights = attention_mask.unsqueeze(-1).to(layers[0].dtype)  # [batch, seq, 1]
        count = weights.sum(dim=1).clamp(min=1.0)  # [batch, 1]: shared by every layer
        out: list[list[torch.Tensor]] = []
        for mode in self.modes:
            if mode == "cls":
                out.append([h[:, 0] for h in layers])
            elif mode == "mean":
                out.append([(h * weights).sum(dim=1) / count for h in layers])
            elif mode == "mean_sqrt_len":
                out.append([(h * weights).sum(dim=1) / count.sqrt() for h in layers])
            elif mode == "max":
                padding = (weights == 0).expand_as(layers[0])
                out.append([h.masked_fill(padding, float("-inf")).amax(dim=1) for h in layers])
            elif mode == "weightedmean":
                positions = torch.arange(1, weights.shape[1] + 1, dtype=weights.dtype).view(1, -1, 1)
                w = weights * positions
                total = w.sum(dim=1).clamp(min=1.0)
                out.append([(h * w).sum(dim=1) / total for h in layers])
            elif mode == "lasttoken":
                last = (attention_mask.sum(dim=1) - 1).clamp(min=0).view(-1, 1, 1)
                index = last.expand(-1, 1, layers[0].shape[-1])
                out.append([torch.gather(h, 1, index)[:, 0] for h in layers])
            else:
                raise ValueError(f"pooling {mode!r} has no graph form")
        return out


def graph_modes(extra: str | None) -> tuple[PooledMode, ...]:
    """The poolings a graph computes: [CLS], mean, and a sentence-transformers model's own mode."""
    if extra is None or extra in ALWAYS_POOLED:
        return ALWAYS_POOLED
    if extra not in POOLED_MODES:
        raise ValueError(f"pooling {extra!r} has no graph form")
    return (*ALWAYS_POOLED, extra)


class _Encoder(torch.nn.Module):
    def __init__(self, loaded: LoadedModel, all_layers: bool, modes: tuple[PooledMode, ...]) -> None:
        super().__init__()
        self.bert = loaded.bert
        self.all_layers = all_layers
        self.has_pooler = loaded.has_pooler
        self.pooling = _Pooling(modes)
        self.head = loaded.head
        self.token_head = loaded.head_architecture == "BertForTokenClassification"

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        out = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=self.all_layers,
            return_dict=True,
        )
        # hidden_states[0] is the embedding output; layers are 1..L, and L is last_hidden_state.
        layers = tuple(out.hidden_states[1:]) if self.all_layers else (out.last_hidden_state,)
        pooler = (out.pooler_output,) if self.has_pooler else ()
        pooled = [v for per_mode in self.pooling(layers, attention_mask) for v in per_mode]
        head: tuple[torch.Tensor, ...] = ()
        if self.head is not None:
            # Dropout is off in eval mode: the classifier reads the pooler (sequence) or the last layer (tokens).
            head = (self.head(out.last_hidden_state if self.token_head else out.pooler_output),)
        return (*layers, *pooler, *pooled, *head)


def pooled_outputs(
    num_layers: int, all_layers: bool = True, modes: tuple[PooledMode, ...] = ALWAYS_POOLED
) -> dict[PooledMode, dict[int, str]]:
    """Pooling mode → 1-based layer → the encoder output holding it (the manifest's ``pooled_outputs``);
    the last layer only for an ``all_layers=False`` graph."""
    first = 1 if all_layers else num_layers
    return {
        mode: {i: pooled_output_name(mode, i, num_layers) for i in range(first, num_layers + 1)}
        for mode in modes
    }


def encoder_outputs(
    loaded: LoadedModel, all_layers: bool = True, modes: tuple[PooledMode, ...] = ALWAYS_POOLED
) -> list[TensorSpec]:
    """The encoder graph's outputs, in graph order: per-token states, the pooler, the pooled vectors
    (all [CLS] vectors, then all means, then the model's own mode), then a fine-tuned head's logits, so
    the older outputs keep their positions."""
    layers = loaded.config.num_hidden_layers
    hidden = loaded.config.hidden_size
    names = [layer_output_name(i, layers) for i in range(1, layers)] if all_layers else []
    specs = [TensorSpec(name=n, dtype="float32", shape=[*BATCH_SEQ, hidden]) for n in names]
    specs.append(TensorSpec(name=LAST_HIDDEN_STATE, dtype="float32", shape=[*BATCH_SEQ, hidden]))
    if loaded.has_pooler:
        specs.append(TensorSpec(name=POOLER_OUTPUT, dtype="float32", shape=["batch", hidden]))
    for per_layer in pooled_outputs(layers, all_layers, modes).values():
        specs.extend(TensorSpec(name=n, dtype="float32", shape=["batch", hidden]) for n in per_layer.values())
    if loaded.head is not None:
        labels = loaded.config.num_labels
        shape: list[str | int] = (
            [*BATCH_SEQ, labels]
            if loaded.head_architecture == "BertForTokenClassification"
            else ["batch", labels]
        )
        specs.append(TensorSpec(name=HEAD_OUTPUT, dtype="float32", shape=shape))
    return specs


def is_pooled_output(name: str) -> bool:
    """Whether ``name`` is a pooled output (``cls_{i}``/``mean_{i}``) by the manifest's naming."""
    mode, _, layer = name.rpartition("_")
    return mode in POOLED_MODES and layer.isdigit()


def pooling_nodes(model: onnx.ModelProto) -> list[str]:
    """The names of the nodes that compute the graph's pooled outputs and nothing else.

    Found by walking back from each pooled output to the per-token outputs and graph inputs it reads,
    so it works on the exported, fused and int8 graphs alike, whatever the nodes are called (not on an
    fp16-converted graph, whose per-token outputs are casts of inner tensors: list the nodes before).

    Raises:
        ValueError: a pooled output depends on an operator outside ``POOLING_OPS`` (the walk would have
            left the pooling, or someone computed it with a MatMul the int8 passes would quantise).
    """
    graph = model.graph
    pooled = [o.name for o in graph.output if is_pooled_output(o.name)]
    stops = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    stops |= {o.name for o in graph.output if not is_pooled_output(o.name)}
    producer = {out: node for node in graph.node for out in node.output}
    found: dict[str, onnx.NodeProto] = {}
    todo = list(pooled)
    while todo:
        tensor = todo.pop()
        node = producer.get(tensor)
        if tensor in stops or node is None or node.name in found:
            continue
        if node.op_type not in POOLING_OPS:
            raise ValueError(
                f"pooled output reaches {node.op_type} node {node.name!r}: not a pooling operator"
            )
        if not node.name:
            raise ValueError(f"an unnamed {node.op_type} node computes a pooled output: it cannot be listed")
        found[node.name] = node
        todo.extend(i for i in node.input if i)
    # A node that also feeds the encoder (a constant the exporter shared) is not the pooling's alone: leave
    # it out, and with it what feeds it, until every listed node feeds listed nodes or pooled outputs only.
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for i in node.input:
            readers.setdefault(i, set()).add(node.name)
    shared = True
    while shared:
        shared = False
        for name, node in list(found.items()):
            if any(r not in found for out in node.output for r in readers.get(out, ())):
                del found[name]
                shared = True
    return [n.name for n in graph.node if n.name in found]


def encoder_inputs() -> list[TensorSpec]:
    return [TensorSpec(name=n, dtype="int64", shape=list(BATCH_SEQ)) for n in INPUT_NAMES]


def mlm_inputs(loaded: LoadedModel) -> list[TensorSpec]:
    return [TensorSpec(name=MLM_INPUT, dtype="float32", shape=["k", loaded.config.hidden_size])]


def mlm_outputs(loaded: LoadedModel) -> list[TensorSpec]:
    return [TensorSpec(name=MLM_OUTPUT, dtype="float32", shape=["k", loaded.config.vocab_size])]


def _export(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    opset: int,
) -> None:
    dynamic_axes = {
        spec.name: {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)} for spec in inputs + outputs
    }
    # The wrapper must be in eval mode itself: the exporter traces in the top module's mode (dropout!).
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The TorchScript exporter: its graphs are the ones onnxruntime.transformers' BERT fusions match.
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=[s.name for s in inputs],
            output_names=[s.name for s in outputs],
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
        )
    onnx.checker.check_model(str(path))


def export_encoder(
    loaded: LoadedModel,
    path: Path,
    opset: int,
    all_layers: bool = True,
    modes: tuple[PooledMode, ...] = ALWAYS_POOLED,
) -> None:
    """Write the fp32 encoder graph; ``all_layers=False`` gives a last-layer-only graph (for benchmarks),
    ``modes`` the poolings it computes (:func:`graph_modes`)."""
    ids = torch.tensor([[101, 704, 1744, 102, 0], [101, 872, 1962, 8024, 102]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    types = torch.zeros_like(ids)
    _export(
        _Encoder(loaded, all_layers, modes),
        (ids, mask, types),
        path,
        encoder_inputs(),
        encoder_outputs(loaded, all_layers, modes),
        opset,
    )


def export_mlm_head(loaded: LoadedModel, path: Path, opset: int) -> None:
    assert loaded.mlm_head is not None, "export_mlm_head called for a model without a masked-LM head"
    hidden = torch.zeros(3, loaded.config.hidden_size, dtype=torch.float32)
    _export(loaded.mlm_head, (hidden,), path, mlm_inputs(loaded), mlm_outputs(loaded), opset)


def log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) to float32's precision for small x too, in operators every ONNX runtime has: u = 1 + x
    rounds by δ = x − (u − 1) (exact for x ≥ 0), and log(1 + x) = log(u) + δ / u to first order in δ, so
    x itself where u rounds to 1. ONNX has no Log1p, and ``log(1 + x)`` alone loses the low digits of a
    small weight (x = 1e-4: 6e-4 of it). Six elementwise passes and no Where (whose ONNX Runtime kernel
    took 12% of the int8 sparse graph, [batch, vocab] being its widest tensor)."""
    u = 1.0 + x
    return torch.log(u) - ((u - 1.0) - x) / u


class _Splade(torch.nn.Module):
    """SPLADE's sparse vector per sequence, as sentence-transformers' ``SpladePooling`` computes it:
    ``pooling`` over the real tokens of log1p(relu(MLM logits × mask)) (log1p twice for ``log1p_relu``).

    With max pooling the only elementwise pass over the [batch, seq, vocab] logits is the ReduceMax (the
    int8 rewrite scales each sequence after it: ``export/quantize.py``): relu and log1p are monotonic, so
    they act on the pooled [batch, vocab] logits; so does the projection's bias (the max of x + b is the
    max of x, plus b, to the last bit); and a padded position takes the hidden state of its row's first
    real token, whose logits are in the max already, instead of a mask over the logits."""

    def __init__(self, mlm_head: torch.nn.Module, sparse: Sparse) -> None:
        super().__init__()
        self.head = mlm_head
        self.sparse = sparse
        # BERT's head (BertLMPredictionHead): a per-token transform, then the vocab projection.
        projection = getattr(mlm_head, "decoder", mlm_head)
        assert isinstance(projection, torch.nn.Linear), f"no vocab projection in {type(mlm_head)}"
        self.projection = projection
        self.transform: torch.nn.Module = getattr(mlm_head, "transform", torch.nn.Identity())

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        x = log1p(torch.relu(x))
        return log1p(x) if self.sparse.activation == "log1p_relu" else x

    def forward(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.sparse.pooling == "max":
            rows = torch.arange(last_hidden_state.shape[0], device=last_hidden_state.device)
            first = last_hidden_state[rows, attention_mask.argmax(dim=1)].unsqueeze(1)
            real = attention_mask.unsqueeze(-1) != 0
            states = self.transform(torch.where(real, last_hidden_state, first))
            logits = torch.nn.functional.linear(states, self.projection.weight).amax(dim=1)
            bias = self.projection.bias
            return self.activate(logits if bias is None else logits + bias)
        logits = self.head(last_hidden_state) * attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
        return self.activate(logits).sum(dim=1)


def sparse_inputs(loaded: LoadedModel) -> list[TensorSpec]:
    hidden, mask = SPARSE_INPUTS
    return [
        TensorSpec(name=hidden, dtype="float32", shape=[*BATCH_SEQ, loaded.config.hidden_size]),
        TensorSpec(name=mask, dtype="int64", shape=list(BATCH_SEQ)),
    ]


def sparse_outputs(loaded: LoadedModel) -> list[TensorSpec]:
    return [TensorSpec(name=SPARSE_OUTPUT, dtype="float32", shape=["batch", loaded.config.vocab_size])]


def export_sparse(loaded: LoadedModel, path: Path, opset: int, sparse: Sparse) -> None:
    """Write the fp32 sparse graph: the masked-LM head and SPLADE's pooling (:class:`_Splade`)."""
    assert loaded.mlm_head is not None, "export_sparse called for a model without a masked-LM head"
    hidden = torch.randn(2, 5, loaded.config.hidden_size, dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.int64)
    module = _Splade(loaded.mlm_head, sparse)
    _export(module, (hidden, mask), path, sparse_inputs(loaded), sparse_outputs(loaded), opset)
