"""The first-run probe (issue 52, item 1): what the first run of a new input shape costs, and which attention
kernel ONNX Runtime chose, under each candidate setting.

    python -m loadtest.first_run --model models/bert-base-chinese-twin            (CUDA, fp16: the device)
    python -m loadtest.first_run --model DIR --provider CPUExecutionProvider --shapes 1x8,4x16

For each configuration, in a fresh process (environment variables and first-run costs are per process):
one warm-up run at ``WARM_SHAPE`` (the session's own first run, CUDA context and all), then for each
``--shapes`` ROWSxLENGTH the first and the second run of that shape, in milliseconds, and the attention
kernel(s) that ONNX Runtime printed for it. Prints a table and writes JSON (``--out``).

The configurations (``CONFIGS``), checked against ONNX Runtime's sources (microsoft/onnxruntime,
``onnxruntime/contrib_ops/cpu/bert/attention_common.h`` and ``contrib_ops/cuda/bert/attention_kernel_options.cc``):

- ``defaults``: the service's session options (:func:`app.model.runtime.session_options`), nothing else.
- ``sdpa-mem-efficient``: the CUDA provider option ``sdpa_kernel=2``. The option is a bitmask of
  ``AttentionBackend``: FLASH_ATTENTION 1, EFFICIENT_ATTENTION 2, TRT_FUSED_ATTENTION 4,
  CUDNN_FLASH_ATTENTION 8, MATH 16 (the unfused kernel, which cannot be turned off); a value > 0 replaces
  the environment variables below.
- ``cudnn-off``: ``ORT_ENABLE_CUDNN_FLASH_ATTENTION=0`` (``kEnableCudnnFlashAttention``; read only when
  ``sdpa_kernel`` is 0). cuDNN's fused attention builds a cuDNN graph per new (batch, sequence) shape
  (``contrib_ops/cuda/bert/cudnn_fmha/``); whether it is on by default depends on the version and device.
- ``mem-pattern-off``: ``SessionOptions.enable_mem_pattern = False`` (a memory plan is made per input shape;
  the service already turns it off on the CPU, so there this row is the defaults again).
- ``eager-loading``: ``CUDA_MODULE_LOADING=EAGER`` (CUDA loads every kernel module at start instead of on its
  first launch).

Every child runs with ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1`` (``kEnableAttentionKernelDebugInfo``):
the CUDA attention ops then print, on C++'s ``std::cout`` with ``std::endl`` (so flushed at each line), one
line per run and node such as ``Operator=Attention Node=... DataType=fp16 SdpaKernel=EFFICIENT_ATTENTION``,
and once an ``AttentionKernelOptions: FLASH_ATTENTION=1 ...`` line. The child's fds 1 and 2 are one pipe
read by this process, so those lines land between the child's own markers for each shape. The CPU provider
prints none: its kernel is ``n/a``, and the CUDA-only configurations are skipped there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import onnxruntime as ort

from app.model.manifest import Variant, load_manifest
from app.model.runtime import CPU, CUDA
from loadtest import raw_onnx
from loadtest.harness import TWIN, parser
from loadtest.harness.report import write_json


@dataclass(frozen=True)
class Config:
    """One setting under test: environment added to the child's, CUDA provider options, session options."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    cuda_options: dict[str, str] = field(default_factory=dict)
    mem_pattern: bool | None = None  # None: the service's choice
    cuda_only: bool = False


# sdpa_kernel bits (attention_common.h, AttentionBackend)
SDPA_EFFICIENT = 2
CONFIGS = (
    Config("defaults"),
    Config("sdpa-mem-efficient", cuda_options={"sdpa_kernel": str(SDPA_EFFICIENT)}, cuda_only=True),
    Config("cudnn-off", env={"ORT_ENABLE_CUDNN_FLASH_ATTENTION": "0"}, cuda_only=True),
    Config("mem-pattern-off", mem_pattern=False),
    Config("eager-loading", env={"CUDA_MODULE_LOADING": "EAGER"}, cuda_only=True),
)
BY_NAME = {c.name: c for c in CONFIGS}
DEBUG_ENV = {"ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO": "1"}
# The session's own first run, apart from the shapes under test (CUDA context, cuBLAS handles, arena).
WARM_SHAPE = (1, 8)
# (rows, length): one text, a small batch, the service's GPU cell (256 x 32), and longer texts.
SHAPES = ((1, 16), (32, 32), (256, 32), (64, 128), (256, 128))
SHAPE_MARK, RESULT_MARK = "@@first_run shape ", "@@first_run result "
KERNEL = re.compile(r"SdpaKernel=(\w+)")
OPTIONS = re.compile(r"AttentionKernelOptions:[^\x1b\n]*")
NA = "n/a"


@dataclass
class ShapeRun:
    rows: int
    length: int
    first_ms: float
    second_ms: float
    kernels: list[str]

    @property
    def kernel(self) -> str:
        return "+".join(self.kernels) or NA


@dataclass
class ConfigRun:
    """One configuration's child: its warm-up, its shapes, the kernel options it printed; or why not."""

    config: str
    warm_ms: float = 0.0
    shapes: list[ShapeRun] = field(default_factory=list)
    kernel_options: str = ""
    skipped: str = ""


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"1x16,256x32"`` → ``[(1, 16), (256, 32)]``."""
    out = []
    for part in text.split(","):
        rows, length = part.lower().split("x")
        out.append((int(rows), int(length)))
    return out


def open_session(model: Path, variant: str, provider: str, config: Config) -> ort.InferenceSession:
    """The encoder with the service's session options, changed as ``config`` says."""
    options = raw_onnx.session_options(provider=provider)
    if config.mem_pattern is not None:
        options.enable_mem_pattern = config.mem_pattern
    file = model / load_manifest(model).graphs["encoder"][cast(Variant, variant)].file
    providers: list[Any] = [(CUDA, config.cuda_options), CPU] if provider == CUDA else [provider]
    session = ort.InferenceSession(str(file), options, providers=providers)
    if session.get_providers()[0] != provider:
        raise SystemExit(f"the session fell back to {session.get_providers()} instead of {provider}")
    return session


def child(model: Path, variant: str, provider: str, config: Config, shapes: list[tuple[int, int]]) -> None:
    """In the child: time the runs, printing a marker before each shape and its result after it."""
    session = open_session(model, variant, provider, config)
    fetch = [raw_onnx.service_output(session)]

    def timed(rows: int, length: int) -> float:
        feed = raw_onnx.synthetic_feed(rows, length)
        t0 = time.perf_counter()
        session.run(fetch, feed)
        return 1e3 * (time.perf_counter() - t0)

    print(f"{SHAPE_MARK}warm", flush=True)
    print(RESULT_MARK + json.dumps({"warm_ms": timed(*WARM_SHAPE)}), flush=True)
    for rows, length in shapes:
        print(f"{SHAPE_MARK}{rows}x{length}", flush=True)
        first, second = timed(rows, length), timed(rows, length)
        print(
            RESULT_MARK + json.dumps({"rows": rows, "length": length, "first": first, "second": second}),
            flush=True,
        )


def parse_child(config: str, output: str) -> ConfigRun:
    """A child's combined output → its :class:`ConfigRun`: each shape's kernels are the ``SdpaKernel=``
    values printed between its marker and its result.

    Raises:
        RuntimeError: the child printed no result for a shape it began (it failed; its output is quoted).
    """
    run = ConfigRun(config)
    kernels: list[str] = []
    for line in output.splitlines():
        if (found := OPTIONS.search(line)) and not run.kernel_options:
            run.kernel_options = found.group(0)
        if line.startswith(SHAPE_MARK):
            kernels = []
        elif line.startswith(RESULT_MARK):
            got = json.loads(line[len(RESULT_MARK) :])
            if "warm_ms" in got:
                run.warm_ms = got["warm_ms"]
            else:
                run.shapes.append(ShapeRun(got["rows"], got["length"], got["first"], got["second"], kernels))
        else:
            kernels.extend(k for k in KERNEL.findall(line) if k not in kernels)
    return run


def probe_one(
    model: Path, variant: str, provider: str, config: Config, shapes: list[tuple[int, int]], timeout: float
) -> ConfigRun:
    """``config`` in a fresh ``python -m loadtest.first_run --child`` process; skipped off CUDA when the
    setting is CUDA's only.

    Raises:
        RuntimeError: the child failed (its exit status and the end of its output).
    """
    if config.cuda_only and provider != CUDA:
        return ConfigRun(config.name, skipped=f"CUDA only ({provider})")
    shape_arg = ",".join(f"{r}x{n}" for r, n in shapes)
    argv = [sys.executable, "-u", "-m", "loadtest.first_run", "--child", config.name, "--model", str(model)]
    argv += ["--variant", variant, "--provider", provider, "--shapes", shape_arg]
    env = {**os.environ, **DEBUG_ENV, **config.env}
    done = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{config.name}: the child exited {done.returncode}:\n{done.stdout[-3000:]}")
    run = parse_child(config.name, done.stdout)
    if len(run.shapes) != len(shapes):
        raise RuntimeError(
            f"{config.name}: {len(run.shapes)} of {len(shapes)} shapes:\n{done.stdout[-3000:]}"
        )
    return run


HEADER = f"{'config':<20}{'shape':>10}{'first ms':>11}{'second ms':>11}{'first/2nd':>10}  kernel"


def table(runs: list[ConfigRun]) -> list[str]:
    """The probe's table: a row per (configuration, shape), a line per skipped configuration."""
    lines = [HEADER]
    for run in runs:
        if run.skipped:
            lines.append(f"{run.config:<20}  skipped: {run.skipped}")
            continue
        lines.append(
            f"{run.config:<20}{'warm-up':>10}{run.warm_ms:>11.2f}{'':>11}{'':>10}  {WARM_SHAPE[0]}x{WARM_SHAPE[1]}"
        )
        for s in run.shapes:
            ratio = s.first_ms / s.second_ms if s.second_ms > 0 else float("nan")
            shape = f"{s.rows}x{s.length}"
            lines.append(
                f"{'':<20}{shape:>10}{s.first_ms:>11.2f}{s.second_ms:>11.2f}{ratio:>10.1f}  {s.kernel}"
            )
    return lines


def run(args: Any) -> dict[str, Any]:
    """Every configuration asked for, one child each; the table printed and the JSON report."""
    configs = [BY_NAME[n] for n in args.configs.split(",")]
    print(f"first-run probe: {args.model} {args.variant} on {args.provider}, onnxruntime {ort.__version__}")
    runs = []
    for config in configs:
        t0 = time.perf_counter()
        runs.append(probe_one(args.model, args.variant, args.provider, config, args.shapes, args.timeout))
        print(f"  {config.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(*table(runs), sep="\n")
    for r in runs:
        if r.kernel_options:
            print(f"{r.config}: {r.kernel_options}")
    report = {
        "model": str(args.model),
        "variant": args.variant,
        "provider": args.provider,
        "onnxruntime": ort.__version__,
        "warm_shape": list(WARM_SHAPE),
        "configs": {c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in configs},
        "runs": [
            {**asdict(r), "shapes": [{**asdict(s), "kernel": s.kernel} for s in r.shapes]} for r in runs
        ],
    }
    write_json(report, args.out, "first-run")
    return report


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.first_run", __doc__, model=TWIN, out=None)
    p.add_argument("--variant", default="fp16", help="the encoder variant (default: %(default)s)")
    p.add_argument("--provider", default=CUDA, help="execution provider (default: %(default)s)")
    p.add_argument("--shapes", type=parse_shapes, default=list(SHAPES), help="ROWSxLENGTH,... to probe")
    p.add_argument("--configs", default=",".join(BY_NAME), help="configurations (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds a child may take")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the configuration this process runs, as a child
    args = p.parse_args(argv)
    if args.child:
        child(args.model, args.variant, args.provider, BY_NAME[args.child], args.shapes)
        return 0
    if args.provider not in ort.get_available_providers():
        raise SystemExit(f"no {args.provider} here ({ort.get_available_providers()})")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
