"""Stage 2: PyTorch → fp32 ONNX graphs.

Two graphs serve every endpoint. The encoder returns each layer's hidden state as its own output (the
service fetches only the ones a batch needs) plus the pooler; the masked-LM head is a separate small graph
``[k, hidden] → [k, vocab]`` so fill-mask runs it on [MASK] positions only.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch

from app.model.manifest import (
    INPUT_NAMES,
    LAST_HIDDEN_STATE,
    MLM_INPUT,
    MLM_OUTPUT,
    POOLER_OUTPUT,
    TensorSpec,
    layer_output_name,
)
from export.source import LoadedModel

BATCH_SEQ = ["batch", "sequence"]


class _Encoder(torch.nn.Module):
    def __init__(self, loaded: LoadedModel, all_layers: bool) -> None:
        super().__init__()
        self.bert = loaded.bert
        self.all_layers = all_layers
        self.has_pooler = loaded.has_pooler

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
        layers = tuple(out.hidden_states[1:-1]) if self.all_layers else ()
        pooler = (out.pooler_output,) if self.has_pooler else ()
        return (*layers, out.last_hidden_state, *pooler)


def encoder_outputs(loaded: LoadedModel, all_layers: bool = True) -> list[TensorSpec]:
    """The encoder graph's outputs, in graph order."""
    layers = loaded.config.num_hidden_layers
    hidden = loaded.config.hidden_size
    names = [layer_output_name(i, layers) for i in range(1, layers)] if all_layers else []
    specs = [TensorSpec(name=n, dtype="float32", shape=[*BATCH_SEQ, hidden]) for n in names]
    specs.append(TensorSpec(name=LAST_HIDDEN_STATE, dtype="float32", shape=[*BATCH_SEQ, hidden]))
    if loaded.has_pooler:
        specs.append(TensorSpec(name=POOLER_OUTPUT, dtype="float32", shape=["batch", hidden]))
    return specs


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


def export_encoder(loaded: LoadedModel, path: Path, opset: int, all_layers: bool = True) -> None:
    """Write the fp32 encoder graph; ``all_layers=False`` gives a last-layer-only graph (for benchmarks)."""
    ids = torch.tensor([[101, 704, 1744, 102, 0], [101, 872, 1962, 8024, 102]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    types = torch.zeros_like(ids)
    _export(
        _Encoder(loaded, all_layers),
        (ids, mask, types),
        path,
        encoder_inputs(),
        encoder_outputs(loaded, all_layers),
        opset,
    )


def export_mlm_head(loaded: LoadedModel, path: Path, opset: int) -> None:
    assert loaded.mlm_head is not None, "export_mlm_head called for a model without a masked-LM head"
    hidden = torch.zeros(3, loaded.config.hidden_size, dtype=torch.float32)
    _export(loaded.mlm_head, (hidden,), path, mlm_inputs(loaded), mlm_outputs(loaded), opset)
