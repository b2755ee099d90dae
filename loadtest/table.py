"""``loadtest.bench``'s table of :class:`loadtest.harness.report.Row`: how a row prints, the columns
derived from other rows (vs naive, % of peak), the issue's targets, and the closing summary."""

from __future__ import annotations

from typing import Any

from loadtest.flops import BertShape
from loadtest.harness.report import Row, cell, target

HEADER = (
    f"{'row':<28} {'sent/s':>9} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'err':>5} "
    f"{'GFLOP/s':>8} {'%peak':>6} {'svc/raw':>7} {'svc/nv':>7} {'cli cpu':>7} {'srv cpu':>7}  note"
)


def format_row(r: Row) -> str:
    """One printed line of the table."""
    if r.sentences_per_s is None:
        return f"{r.label:<28} {r.note}"
    return (
        f"{r.label:<28} {cell(r.sentences_per_s, '.1f', 9)} {cell(r.requests_per_s, '.1f', 9)} "
        f"{cell(r.p50_ms, '.1f', 8)} {cell(r.p90_ms, '.1f', 8)} {cell(r.p99_ms, '.1f', 8)} "
        f"{cell(r.errors, 'd', 5)} {cell(r.useful_gflops, '.1f', 8)} "
        f"{cell(None if r.peak_share is None else r.peak_share * 100, '.0f', 6)} "
        f"{cell(r.vs_raw, '.2f', 7)} {cell(r.vs_naive, '.1f', 7)} {cell(r.client_cores, '.2f', 7)} "
        f"{cell(r.server_cores, '.2f', 7)}  {r.notes()}"
    )


def link_naive(
    rows: list[Row], peaks: dict[str, float], service_variant: str, flops_per_sentence: float
) -> None:
    """Fill the naive rows' useful GFLOP/s and % of the fp32 peak, and the service rows' % of their peak
    and service/naive ratio (against the same cell of the naive service)."""
    naive = {r.label.removeprefix("naive "): r for r in rows if r.kind == "naive"}
    for r in naive.values():
        if r.sentences_per_s is not None:
            r.useful_gflops = r.sentences_per_s * flops_per_sentence / 1e9
            r.peak_share = r.useful_gflops * 1e9 / peaks["fp32"]
    for r in (r for r in rows if r.kind == "service"):
        twin = naive.get(r.label.removeprefix("service "))
        if twin is not None and twin.sentences_per_s:
            r.vs_naive = (r.sentences_per_s or 0) / twin.sentences_per_s
        if r.useful_gflops is not None:
            r.peak_share = r.useful_gflops * 1e9 / peaks[service_variant]


def targets(rows: list[Row], facts: dict[str, Any], variant: str) -> list[str]:
    """Issue 5's targets, each with its measured value."""
    by = {r.label: r for r in rows}
    out: list[str] = []

    def say(name: str, ok: bool | None, detail: str) -> None:
        out.append(target(name, ok, detail))

    svc32 = by.get("service c=32 x1")
    if svc32 and svc32.vs_raw is not None:
        say("c=32 x1 >= 0.90 x raw ceiling", svc32.vs_raw >= 0.9, f"{svc32.vs_raw:.2f}")
    svc1 = by.get("service c=1 x1")
    raw1 = next(
        (
            r
            for r in rows
            if r.kind == "raw" and r.extra.get("variant") == variant and r.extra.get("batch_size") == 1
        ),
        None,
    )
    if svc1 and raw1 and svc1.p50_ms is not None and raw1.p50_ms is not None:
        limit = 1.15 * raw1.p50_ms + 1
        say(
            "c=1 p50 <= 1.15 x raw single + 1 ms",
            svc1.p50_ms <= limit,
            f"{svc1.p50_ms:.1f} ms vs {limit:.1f} ms",
        )
    if svc32 and svc32.vs_naive is not None:
        say("c=32 >= 10 x naive", svc32.vs_naive >= 10, f"{svc32.vs_naive:.1f}x")
    if svc32 and svc32.extra.get("padding_share") is not None:
        share = svc32.extra["padding_share"]
        say("padding <= 10% at c=32", share <= 0.10, f"{share:.1%}")
    hit = next((r for r in rows if r.label.startswith("cache 100%")), None)
    if hit is not None:
        rps = hit.requests_per_s
        say(
            "100%-hit >= 2000 req/s",
            None if rps is None else rps >= 2000,
            hit.note if rps is None else f"{rps:.0f}",
        )
    if "memory_steady" in facts and "model_bytes" in facts:
        limit = 1.5 * facts["model_bytes"] + facts.get("cache_budget", 0)
        rss = facts["memory_steady"]["rss"]  # summed over the process tree: one process by default
        say(
            "RSS <= 1.5 x model + cache budget",
            rss <= limit,
            f"{rss / 2**20:.0f} MiB vs {limit / 2**20:.0f} MiB "
            f"(model {facts['model_bytes'] / 2**20:.0f} MiB, service started with cache off)",
        )
    return out


def sparse_targets(rows: list[Row]) -> list[str]:
    """Issue 34's target: each ``/embed_sparse`` service row against the same cell of ``/embed``."""
    by = {r.label: r for r in rows if r.kind == "service"}
    out: list[str] = []
    for label, sparse in by.items():
        dense = by.get(label.removesuffix(" /embed_sparse"))
        if dense is None or dense is sparse or not dense.sentences_per_s or sparse.sentences_per_s is None:
            continue
        ratio = sparse.sentences_per_s / dense.sentences_per_s
        cell_name = label.removeprefix("service ").removesuffix(" /embed_sparse")
        detail = f"{sparse.sentences_per_s:.1f} / {dense.sentences_per_s:.1f} sent/s = {ratio:.2f}"
        out.append(target(f"/embed_sparse {cell_name} >= 0.8 x /embed", ratio >= 0.8, detail))
    return out


def summary(
    rows: list[Row],
    facts: dict[str, Any],
    peaks: dict[str, float],
    shape: BertShape,
    service_variant: str,
    cache_bytes: int,
    seconds: float,
) -> list[str]:
    """The closing block: every row again, the GEMM peaks, the FLOP formula, memory, and the targets."""
    cache_facts = facts.get("cache", {})
    start, steady = facts["memory_after_start"], facts["memory_steady"]
    out = [
        "",
        "=" * len(HEADER),
        f"{len(rows)} rows; measured on a shared machine; {seconds:.0f} s",
        HEADER,
        *(format_row(r) for r in rows),
        "",
        f"GEMM peak (one [512x768]x[768x3072] MatMul in ONNX Runtime): fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, "
        f"int8 MatMulInteger {peaks['int8'] / 1e9:.1f} GOP/s; %peak uses the row's precision (naive: fp32).",
        "FLOPs per sentence of L tokens: 2*L*N*(4H^2 + 2HI) + 4*N*L^2*H + 2H^2 (useful: each sentence at its "
        f"own length); N={shape.layers}, H={shape.hidden}, I={shape.intermediate}.",
        f"Service RSS, summed over its processes (loadtest.procs): {start['rss'] / 2**20:.0f} MiB after start, "
        f"{steady['rss'] / 2**20:.0f} MiB steady (each process's peak, summed: {steady['peak_rss'] / 2**20:.0f} "
        f"MiB); PSS (shared pages once) {start['pss'] / 2**20:.0f} / {steady['pss'] / 2**20:.0f} MiB; "
        f"{service_variant} graphs {facts['model_bytes'] / 2**20:.0f} MiB; cache off in the service rows"
        + (
            f"; with a {cache_bytes / 2**20:.0f} MiB cache budget: "
            f"{cache_facts['memory_steady']['rss'] / 2**20:.0f} MiB after the cache rows"
            if "memory_steady" in cache_facts
            else ""
        ),
        *(
            f"  {p['role']} {p['pid']}: RSS {p['rss'] / 2**20:.0f} MiB, PSS {p['pss'] / 2**20:.0f} MiB steady"
            for p in (steady["processes"] if len(steady["processes"]) > 1 else [])
        ),
        "Targets (issue 5):",
        *targets(rows, facts, service_variant),
    ]
    sparse = sparse_targets(rows)
    if sparse or facts.get("sparse_cost"):
        cost = facts.get("sparse_cost")
        out += ["Targets (issue 34):", *sparse, *([cost["line"]] if cost else [])]
    return out
