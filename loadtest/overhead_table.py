"""The rows of ``loadtest.overhead``'s table: what a cell holds (the server's CPU per sentence, split
into the model's and the rest, and the rest into the floor and the machinery), how it prints, and issue
19's targets."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.table import cell

# Issue 19's targets (CPU, tiny model, 2 cores): machinery per sentence at 64x32 and 256x32 with GPU-like
# batches, and at 8x32 with the CPU defaults; CPU outside Session.run per single-text request.
MACHINERY_US_GPU_LIKE = {"64x32": 25.0, "256x32": 25.0}
MACHINERY_US_CPU = {"8x32": 60.0}
OUTSIDE_US_PER_REQUEST_X1 = 250.0
SCALING_256_VS_8 = 0.9


@dataclass
class Cell:
    """One clients × texts cell; CPU figures are per sentence the service computed."""

    clients: int
    texts: int
    sentences_per_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int
    first_error: str | None
    status_counts: dict[str, int]
    mean_batch: float
    computed: float  # inputs the service ran through the encoder during the whole cell
    server_cpu_s: float
    session_run_s: float
    wall_s: float
    client_cores: float
    note: str
    tokenize_us: float = float("nan")  # the floor (loadtest.floor), per sentence
    write_us: float = float("nan")

    @property
    def label(self) -> str:
        return f"{self.clients}x{self.texts}"

    @property
    def cpu_us(self) -> float:
        return 1e6 * self.server_cpu_s / self.computed if self.computed else float("nan")

    @property
    def run_us(self) -> float:
        return 1e6 * self.session_run_s / self.computed if self.computed else float("nan")

    @property
    def outside_us(self) -> float:
        return self.cpu_us - self.run_us

    @property
    def floor_us(self) -> float:
        return self.tokenize_us + self.write_us

    @property
    def machinery_us(self) -> float:
        return self.outside_us - self.floor_us

    @property
    def server_cores(self) -> float:
        return self.server_cpu_s / self.wall_s if self.wall_s else float("nan")


def targets(cells: list[Cell], gpu_like: bool) -> list[str]:
    """The issue's CPU targets that apply to this run's batch settings, each with its measured value."""
    out: list[str] = []

    def say(name: str, ok: bool | None, detail: str) -> None:
        out.append(f"  [{'n/a ' if ok is None else ('PASS' if ok else 'MISS')}] {name}: {detail}")

    machinery, mode = (
        (MACHINERY_US_GPU_LIKE, "--gpu-like") if gpu_like else (MACHINERY_US_CPU, "CPU defaults")
    )
    other = "CPU defaults" if gpu_like else "--gpu-like"
    by = {c.label: c for c in cells}
    for label, bound in machinery.items():
        name = f"machinery <= {bound:.0f} us/sentence at {label} ({mode})"
        c = by.get(label)
        say(
            name,
            None if c is None else c.machinery_us <= bound,
            "not run" if c is None else f"{c.machinery_us:.0f} us",
        )
    for label, bound in (MACHINERY_US_CPU if gpu_like else MACHINERY_US_GPU_LIKE).items():
        say(f"machinery <= {bound:.0f} us/sentence at {label} ({other})", None, f"run with {other}")
    for c in cells:
        if c.texts == 1:
            say(
                f"CPU outside Session.run <= {OUTSIDE_US_PER_REQUEST_X1:.0f} us/request at {c.label}",
                c.outside_us <= OUTSIDE_US_PER_REQUEST_X1,
                f"{c.outside_us:.0f} us",
            )
    small, large = by.get("8x32"), by.get("256x32")
    if small is None or large is None or not small.sentences_per_s:
        say(f"256x32 sentences/s >= {SCALING_256_VS_8} x 8x32", None, "needs both cells")
    else:
        ratio = large.sentences_per_s / small.sentences_per_s
        say(
            f"256x32 sentences/s >= {SCALING_256_VS_8} x 8x32",
            ratio >= SCALING_256_VS_8,
            f"{ratio:.2f} ({large.sentences_per_s:.0f} / {small.sentences_per_s:.0f})",
        )
    return out


HEADER = (
    f"{'clients x texts':<16}{'sent/s':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'err':>5}{'batch':>7}"
    f"{'srv cpu':>8}{'cli cpu':>8}{'us/sent':>9}{'in run':>8}{'outside':>8}{'floor':>7}{'machin.':>8}  note"
)


def format_cell(c: Cell) -> str:
    return (
        f"{c.label:<16}{cell(c.sentences_per_s, '.0f', 9)}{cell(c.requests_per_s, '.0f', 9)}"
        f"{cell(c.p50_ms, '.1f', 9)}{cell(c.p99_ms, '.1f', 9)}{cell(c.errors, 'd', 5)}"
        f"{cell(c.mean_batch, '.1f', 7)}{cell(c.server_cores, '.2f', 8)}{cell(c.client_cores, '.2f', 8)}"
        f"{cell(c.cpu_us, '.0f', 9)}{cell(c.run_us, '.0f', 8)}{cell(c.outside_us, '.0f', 8)}"
        f"{cell(c.floor_us, '.0f', 7)}{cell(c.machinery_us, '.0f', 8)}  "
        + "; ".join(x for x in (c.note, f"first error: {c.first_error[:100]}" if c.first_error else "") if x)
    )
