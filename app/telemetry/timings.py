"""How long a request spent in each stage: measured by the tasks, read by the traces, the logs and the
API layer's headers. A module of its own so that what watches a request imports nothing of what serves it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timings:
    """Milliseconds a request spent in each stage (the API layer sends them as headers)."""

    queue_ms: float = 0.0
    tokenization_ms: float = 0.0
    inference_ms: float = 0.0
    total_ms: float = 0.0
    tokens: int = 0  # tokens the encoder computed for the request ([CLS]/[SEP] included; cache hits: 0)


def ms(seconds: float) -> float:
    return seconds * 1000
