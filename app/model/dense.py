"""A sentence-transformers model's ``Dense`` modules, run in numpy on pooled vectors.

Each is ``activation(x @ weight.T + bias)``; the export writes their weights as ``.npy`` files and
declares them in the manifest (``defaults.dense``), validated there against PyTorch. Every pooled vector
of such a model goes through them, before layers are combined and vectors normalised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.model.manifest import DenseLayer

ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@dataclass(frozen=True)
class Dense:
    weight_t: np.ndarray  # [in, out] float32, transposed once at load
    bias: np.ndarray | None
    activation: Callable[[np.ndarray], np.ndarray]


def dense(weight: np.ndarray, bias: np.ndarray | None, activation: str) -> Dense:
    """One module from its weight [out, in], bias [out] (or None) and activation's name."""
    return Dense(
        np.ascontiguousarray(weight.astype(np.float32).T),
        bias.astype(np.float32) if bias is not None else None,
        ACTIVATIONS[activation],
    )


def load(folder: Path, layers: list[DenseLayer]) -> tuple[Dense, ...]:
    """The Dense modules the manifest declares, from their ``.npy`` files in ``folder``."""
    return tuple(
        dense(
            np.load(folder / layer.weight),
            np.load(folder / layer.bias) if layer.bias is not None else None,
            layer.activation,
        )
        for layer in layers
    )


def apply(vectors: np.ndarray, layers: tuple[Dense, ...]) -> np.ndarray:
    """Run ``layers`` on the last axis of ``vectors`` ([..., in] → [..., out])."""
    for layer in layers:
        vectors = vectors @ layer.weight_t
        if layer.bias is not None:
            vectors = vectors + layer.bias
        vectors = layer.activation(vectors).astype(np.float32, copy=False)
    return vectors


def width(layers: list[DenseLayer], hidden: int) -> int:
    """The width of a pooled vector after ``layers``."""
    return layers[-1].out_features if layers else hidden
