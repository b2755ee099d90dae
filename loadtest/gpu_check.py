"""The CUDA path on a GPU machine: fp16 raw ceiling and the service, with achieved TFLOP/s.

    python -m loadtest.gpu_check --model models/bert-base-chinese-twin [--peak-tflops 989] [--seconds 3]
    python -m loadtest.gpu_check --model DIR --provider CPUExecutionProvider --seconds 0.2   (smoke test)

Needs onnxruntime-gpu in this environment (never beside plain onnxruntime) and a folder exported with
the fp16 variant (``loadtest/gpu_check.sh`` does both). Prints, for sequence 32 and 128:

- raw: the fp16 encoder on CUDAExecutionProvider at batch 32..256, sentences/s and achieved TFLOP/s
  (``loadtest.flops.BertShape.flops``) against ``--peak-tflops`` (H200 dense fp16 tensor cores: 989);
- service: ``python -m app`` with ``ZHEMBED_VARIANT=fp16`` on CUDA, 128 concurrent clients (``--clients``)
  sending 16 texts of that length per request, sentences/s and p50/p99.

Also validates fp16 on CUDA against the fp32 graph (pooled cosine on the same inputs), since the export
stage validated it on whatever provider the exporting machine had. ``--provider CPUExecutionProvider``
runs the same steps on the CPU (a CI test does, on a tiny model), so the script cannot rot unseen; its
numbers then mean nothing. Exits 1 when a service cell had errors or answered nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson

from loadtest.flops import BertShape, session_options, synthetic_feed
from loadtest.loadgen import run_cell
from loadtest.server import HOST, ServiceProcess

CUDA = "CUDAExecutionProvider"
TEXT_CHARS = {32: "北京是中国的首都，也是一座历史悠久的城市。" + "我们明天去故宫", 128: "今天天气很好。" * 18}


def _session(path: Path, provider: str) -> ort.InferenceSession:
    session = ort.InferenceSession(str(path), session_options(provider=provider), providers=[provider])
    if session.get_providers()[0] != provider:
        raise SystemExit(f"the session fell back to {session.get_providers()} instead of {provider}")
    return session


def parity(model: Path, manifest: dict, provider: str) -> float:
    fp16 = _session(model / manifest["graphs"]["encoder"]["fp16"]["file"], provider)
    fp32 = _session(model / manifest["graphs"]["encoder"]["fp32"]["file"], "CPUExecutionProvider")
    feed = synthetic_feed(16, 48)
    a = fp16.run(["last_hidden_state"], feed)[0].mean(1)
    b = fp32.run(["last_hidden_state"], feed)[0].mean(1)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


def raw(model: Path, manifest: dict, shape: BertShape, peak: float, seconds: float, provider: str) -> None:
    session = _session(model / manifest["graphs"]["encoder"]["fp16"]["file"], provider)
    print(f"{'seq':>5}{'batch':>7}{'sentences/s':>13}{'TFLOP/s':>10}{'% peak':>8}")
    for seq in (32, 128):
        for batch in (32, 64, 128, 256):
            feed = synthetic_feed(batch, seq)
            session.run(["last_hidden_state"], feed)
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                session.run(["last_hidden_state"], feed)
                count += 1
            rate = count * batch / (time.perf_counter() - start)
            tflops = rate * shape.flops(seq) / 1e12
            print(f"{seq:>5}{batch:>7}{rate:>13.0f}{tflops:>10.1f}{100 * tflops / peak:>8.1f}")


def service(model: Path, seconds: float, provider: str, clients: int = 128) -> bool:
    """The service cells; False when one had errors or answered nothing."""
    env = {
        "ZHEMBED_MODEL": str(model),
        "ZHEMBED_VARIANT": "fp16",
        "ZHEMBED_PROVIDERS": provider,
        "ZHEMBED_MAX_BATCH_SIZE": "256",
        "ZHEMBED_MAX_BATCH_TOKENS": "32768",
        "ZHEMBED_MAX_CONCURRENT_INPUTS": "4096",
        "ZHEMBED_CACHE_BYTES": "0",
    }
    if provider == CUDA:
        # A GPU batch costs little per token: favour full batches over tight length groups (settings.py).
        env["ZHEMBED_BATCH_OVERHEAD_TOKENS"] = "1024"
    ok = True
    with ServiceProcess("app", env, Path("loadtest/results/gpu-service.log")) as svc:
        for seq, text in TEXT_CHARS.items():

            def body(n: int, text: str = text) -> tuple[bytes, int]:
                # 16 distinct texts (the service computes a repeated text once); truncate: the numbers in
                # front may take the longest text past a small model's limit.
                inputs = [f"{n}.{i}{text}" for i in range(16)]
                return orjson.dumps({"inputs": inputs, "long_text": "truncate"}), 16

            cell = asyncio.run(run_cell(HOST, svc.port, "/embed", body, clients, seconds, 3.0))
            print(
                f"service seq≈{seq}: {cell.sentences_per_s:.0f} sentences/s, p50 {cell.percentile(50):.1f} ms, "
                f"p99 {cell.percentile(99):.1f} ms, errors {cell.errors}"
                + (f" (first: {cell.first_error})" if cell.first_error else "")
            )
            ok = ok and cell.errors == 0 and cell.requests > 0
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_check", description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("models/bert-base-chinese-twin"))
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    # The CPU smoke run wants fewer: its cell must outlast ~3 requests or its rate is noise (bench.py).
    parser.add_argument("--clients", type=int, default=128, help="concurrent clients of the service cells")
    parser.add_argument("--provider", default=CUDA, help="execution provider (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.provider not in ort.get_available_providers():
        raise SystemExit(
            f"no {args.provider} here ({ort.get_available_providers()}): install onnxruntime-gpu"
        )
    manifest = json.loads((args.model / "manifest.json").read_text())
    config = manifest["config"]
    shape = BertShape(config["num_layers"], config["hidden_size"], config["intermediate_size"])
    cosine = parity(args.model, manifest, args.provider)
    print(f"fp16 on {args.provider} vs fp32 on CPU, pooled cosine min: {cosine:.6f}")
    raw(args.model, manifest, shape, args.peak_tflops, args.seconds, args.provider)
    return 0 if service(args.model, args.seconds * 3, args.provider, args.clients) else 1


if __name__ == "__main__":
    sys.exit(main())
