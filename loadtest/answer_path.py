"""What stands between ``Session.run`` and the socket for ``POST /embed`` (issue 52, item 4), per sentence.

    python -m loadtest.answer_path --model models/bert-base-chinese-twin --variant fp16 --provider CUDAExecutionProvider
    python -m loadtest.answer_path --model DIR --provider CPUExecutionProvider --seconds 4

Runs the service's own functions, in this process, on the encoder's real output for a batch, for each
cell ``BATCHxREQUEST`` of ``--cells`` (default ``256x32`` and ``1x1``: a batch of 256 rows answering
requests of 32 texts, and one text alone):

- ``run``: ``Session.run`` of the batch, fetching what a default /embed fetches (the reference, not part of
  the answer path; on CUDA it includes the copy of the fetched outputs to host memory);
- ``split``: :func:`app.engine.postprocess.split_batch`, the batch's pooled vectors copied into each job;
- ``combine``: :func:`app.tasks.layers.input_vectors` of each job (the layer mix and the normalisation);
- ``float`` / ``base64``: :func:`app.api.encoding.encode_vectors` and
  :func:`app.api.http.routes.json_response` of each request's vectors: the body as sent.

Each stage is timed in interleaved rounds (:func:`loadtest.raw_onnx.interleaved`, the median of its calls),
divided by the sentences it handles, in microseconds. Also printed: the body's bytes per sentence, and
the share of a sentence's answer path that float JSON adds over base64. Writes JSON (``--out``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import onnxruntime as ort

from app.api.encoding import encode_vectors
from app.api.http.routes import json_response
from app.engine.postprocess import FinishedBatch, split_batch
from app.engine.work import Job, Need, Seq
from app.model.manifest import Variant
from app.tasks.layers import input_vectors
from app.tasks.options import LayerMix
from loadtest import raw_onnx
from loadtest.first_run import parse_shapes
from loadtest.harness import TWIN, parser
from loadtest.harness.report import write_json

LENGTH = 32  # tokens a text, [CLS] and [SEP] included: the corpus's typical length
STAGES = ("run", "split", "combine", "float", "base64")
MIX = LayerMix("concat")  # one layer: a default /embed


def finished_batch(
    outputs: dict[str, np.ndarray],
    rows: int,
    per_request: int,
    layer: int,
    pooled: str,
    loop: asyncio.AbstractEventLoop,
) -> tuple[FinishedBatch, list[Job]]:
    """A batch of ``rows`` sequences from requests of ``per_request`` texts, as the inference stage hands
    it over, its outputs those of a real run; and its jobs, fresh (no vectors yet)."""
    need = Need(layers=(layer,), pooling="mean")
    jobs = [Job(loop, min(per_request, rows - start)) for start in range(0, rows, per_request)]
    seqs = [
        Seq(np.ones(LENGTH, np.int64), need, jobs[i // per_request], i % per_request, 0.0)
        for i in range(rows)
    ]
    batch = FinishedBatch(
        sequences=seqs,
        attention_mask=np.ones((rows, LENGTH), np.int64),
        outputs=outputs,
        mask_rows={},
        mask_logits=None,
        sparse={},
        sparse_vectors=None,
        output_names={layer: raw_onnx.LAST_HIDDEN_STATE},
        started_at=0.0,
        finished_at=0.0,
        begun_at=0.0,
        pooled_names={(layer, "mean"): pooled},
    )
    return batch, jobs


def cell(
    session: ort.InferenceSession, rows: int, per_request: int, layer: int, seconds: float, width: int | None
) -> dict[str, Any]:
    """One cell's stages in microseconds per sentence, and its body bytes per sentence by encoding; with
    ``width``, the answer path's stages run on random unit-scale vectors of that width instead of the
    model's own (a small model standing in for a real-size one: only the width matters past ``run``)."""
    fetch = raw_onnx.service_output(session)
    feed = raw_onnx.synthetic_feed(rows, LENGTH)
    outputs = dict(zip([fetch], session.run([fetch], feed), strict=True))
    if width is not None:
        rng = np.random.default_rng(0)
        outputs[fetch] = (rng.standard_normal((rows, width)) / np.sqrt(width)).astype(np.float32)
    loop = asyncio.new_event_loop()
    try:
        batch, jobs = finished_batch(outputs, rows, per_request, layer, fetch, loop)
        split_batch(batch)
        requests = [cast(np.ndarray, j.vectors) for j in jobs]
        vectors = [input_vectors(j.count, v, MIX, True) for j, v in zip(jobs, requests, strict=True)]

        def split() -> None:
            for job in jobs:
                job.vectors = None
            split_batch(batch)

        def encoded(encoding: str) -> Callable[[], object]:
            return lambda: [json_response(encode_vectors(v, encoding)).body for v in vectors]  # type: ignore[arg-type]

        runs: dict[str, Callable[[], object]] = {
            "run": lambda: session.run([fetch], feed),
            "split": split,
            "combine": lambda: [
                input_vectors(j.count, v, MIX, True) for j, v in zip(jobs, requests, strict=True)
            ],
            "float": encoded("float"),
            "base64": encoded("base64"),
        }
        per_call = raw_onnx.interleaved(runs, seconds)
    finally:
        loop.close()
    us = {name: 1e6 * t / rows for name, t in per_call.items()}
    sizes = {
        e: sum(len(json_response(encode_vectors(v, e)).body) for v in vectors) / rows
        for e in ("float", "base64")
    }
    path = {e: us["split"] + us["combine"] + us[e] for e in ("float", "base64")}
    return {
        "rows": rows,
        "per_request": per_request,
        "us_per_sentence": us,
        "bytes_per_sentence": sizes,
        "answer_path_us": path,
        "float_over_base64": path["float"] / path["base64"],
    }


HEADER = (
    f"{'cell':>8}"
    + "".join(f"{s:>9}" for s in STAGES)
    + f"{'path f':>9}{'path b64':>9}{'f/b64':>7}{'B f':>7}{'B b64':>7}"
)


def line(got: dict[str, Any]) -> str:
    us, path, size = got["us_per_sentence"], got["answer_path_us"], got["bytes_per_sentence"]
    label = f"{got['rows']}x{got['per_request']}"
    return (
        f"{label:>8}"
        + "".join(f"{us[s]:>9.1f}" for s in STAGES)
        + f"{path['float']:>9.1f}{path['base64']:>9.1f}{got['float_over_base64']:>7.2f}"
        + f"{size['float']:>7.0f}{size['base64']:>7.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.answer_path", __doc__, model=TWIN, seconds=3.0, out=None)
    p.add_argument("--variant", default="fp32", help="the encoder variant (default: %(default)s)")
    p.add_argument(
        "--provider", default="CPUExecutionProvider", help="execution provider (default: %(default)s)"
    )
    p.add_argument("--cells", type=parse_shapes, default=[(256, 32), (1, 1)], help="BATCHxREQUEST,...")
    p.add_argument(
        "--width", type=int, help="random vectors of this width past run (a tiny model as a big one)"
    )
    args = p.parse_args(argv)
    session = raw_onnx.open_encoder(args.model, cast(Variant, args.variant), provider=args.provider)
    layer = raw_onnx.shape_of(args.model).layers
    width = f", vectors of width {args.width} past run (random)" if args.width else ""
    print(
        f"answer path of /embed: {args.model} {args.variant} on {args.provider}, {LENGTH} tokens a text{width}"
    )
    print("microseconds per sentence (median over interleaved rounds); path = split + combine + encoding;")
    print("B: body bytes per sentence")
    print(HEADER)
    cells = []
    for rows, per_request in args.cells:
        cells.append(cell(session, rows, per_request, layer, args.seconds, args.width))
        print(line(cells[-1]), flush=True)
    report = {
        "model": str(args.model),
        "variant": args.variant,
        "provider": args.provider,
        "length": LENGTH,
        "width": args.width,
    }
    write_json({**report, "seconds": args.seconds, "cells": cells}, args.out, "answer-path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
