"""The device run's one report (``loadtest/gpu_check.sh``): the JSON of the stages that ran before
:mod:`loadtest.gpu_check` attached to its own, and all of it as a markdown page.

:func:`attached` reads ``NAME=PATH`` pairs (``--attach``) into the report; :func:`markdown` writes the
parity, the raw fp16 grid, every service cell, the targets, the first-run probe (:mod:`loadtest.first_run`),
the answer path (:mod:`loadtest.answer_path`) and the stage times, each where the report has it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def attached(pairs: list[str]) -> dict[str, Any]:
    """``["first_run=path.json", ...]`` → ``{"first_run": <its JSON>, ...}``.

    Raises:
        SystemExit: a pair without ``=``, or a file that is not there (a stage that failed says so).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep:
            raise SystemExit(f"--attach takes NAME=PATH, not {pair!r}")
        file = Path(path)
        out[name] = json.loads(file.read_text()) if file.is_file() else {"missing": str(file)}
    return out


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None or value != value else format(value, fmt)


def _cells(report: dict[str, Any]) -> list[str]:
    lines = [
        "| cell | workers | sentences/s | requests/s | p50 ms | p99 ms | p99/p50 | mean batch | busy | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report.get("cells", []):
        p50, p99 = c.get("p50_ms"), c.get("p99_ms")
        tail = p99 / p50 if p50 and p99 else None
        figures = [
            _num(c.get("sentences_per_s"), ",.0f"),
            _num(c.get("requests_per_s"), ",.0f"),
            _num(p50, ".2f"),
            _num(p99, ".2f"),
            _num(tail, ".2f"),
            _num(c.get("mean_batch"), ".1f"),
            _num(c.get("busy"), ".2f"),
            str(c.get("errors")),
        ]
        lines.append(f"| {c['label']} | {c['workers']} | " + " | ".join(figures) + " |")
    return lines


def _first_run(probe: dict[str, Any]) -> list[str]:
    if "runs" not in probe:
        return [f"first-run probe: not run ({probe})"]
    lines = [
        f"First-run probe ({probe['variant']} on {probe['provider']}, ms; warm-up shape "
        f"{probe['warm_shape'][0]}x{probe['warm_shape'][1]}):",
        "",
        "| config | shape | first ms | second ms | first / second | kernel |",
        "|---|---|---|---|---|---|",
    ]
    for run in probe["runs"]:
        if run["skipped"]:
            lines.append(f"| {run['config']} | skipped: {run['skipped']} | | | | |")
            continue
        lines.append(f"| {run['config']} | warm-up | {run['warm_ms']:.2f} | | | |")
        for s in run["shapes"]:
            ratio = s["first_ms"] / s["second_ms"] if s["second_ms"] else None
            row = [
                f"{s['rows']}x{s['length']}",
                f"{s['first_ms']:.2f}",
                f"{s['second_ms']:.2f}",
                _num(ratio, ".1f"),
            ]
            lines.append(f"| {run['config']} | " + " | ".join(row) + f" | {s['kernel']} |")
    return lines


def _answer_path(path: dict[str, Any]) -> list[str]:
    if "cells" not in path:
        return [f"answer path: not run ({path})"]
    lines = [
        f"Answer path of /embed ({path['variant']} on {path['provider']}), µs a sentence:",
        "",
        "| cell | run | split | combine | float | base64 | path float / base64 | body bytes float / base64 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in path["cells"]:
        us, size = c["us_per_sentence"], c["bytes_per_sentence"]
        stages = " | ".join(f"{us[s]:.1f}" for s in ("run", "split", "combine", "float", "base64"))
        lines.append(
            f"| {c['rows']}x{c['per_request']} | {stages} | {c['answer_path_us']['float']:.1f} / "
            f"{c['answer_path_us']['base64']:.1f} | {size['float']:.0f} / {size['base64']:.0f} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    raw = report.get("raw", [])
    lines = [
        f"# gpu_check: {report['model']} on {report['provider']} (onnxruntime {report['onnxruntime']})",
        "",
        f"fp16 against fp32 pooled cosine min {report['parity_cosine_min']:.6f}; one text across batchings: "
        f"normalised vector max |diff| {report['batchings']['pooled_max_abs']:.2e}.",
        "",
        "| raw fp16 batch | sequence | sentences/s |",
        "|---|---|---|",
        *(f"| {r['batch']} | {r['seq']} | {r['sentences_per_s']:,.0f} |" for r in raw),
        "",
        *_cells(report),
        "",
    ]
    if report.get("not_started") or report.get("over_budget"):
        lines += [f"Did not start: {report.get('not_started')}; over budget: {report.get('over_budget')}", ""]
    lines += ["Targets:", "", *(f"- {t.strip()}" for t in report.get("targets", [])), ""]
    if "first_run" in report:
        lines += [*_first_run(report["first_run"]), ""]
    if "answer_path" in report:
        lines += [*_answer_path(report["answer_path"]), ""]
    stages = {**report.get("stages", {}), "gpu_check": report.get("total_s", 0.0)}
    if len(stages) > 1:
        lines += ["| stage | seconds |", "|---|---|", *(f"| {k} | {v:.0f} |" for k, v in stages.items()), ""]
    return "\n".join(lines)
