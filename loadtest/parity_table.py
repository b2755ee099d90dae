"""Print the parity table that an export recorded in its manifest.

python -m loadtest.parity_table models/bert-base-chinese-twin [more model folders…]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.model.manifest import load_manifest

METRICS = ("cosine_min", "cosine_mean", "max_abs_diff", "mlm_top1", "mlm_top5")


def table(folder: Path) -> str:
    manifest = load_manifest(folder)
    lines = [
        f"{manifest.source.model} ({manifest.source.weights} weights, "
        f"{manifest.config.num_layers} layers × {manifest.config.hidden_size})",
        f"{'variant':<8}{'provider':<22}" + "".join(f"{m:>14}" for m in METRICS) + f"{'MB':>8}  passed",
    ]
    for variant, result in manifest.validation.items():
        cells = []
        for name in METRICS:
            metric = result.metrics.get(name)
            if metric is None:
                cells.append(f"{'-':>14}")
                continue
            mark = "" if metric.threshold is None else ("*" if metric.enforced else "°")
            cells.append(f"{metric.value:>13.6g}{mark or ' '}")
        size = manifest.graphs["encoder"][variant].bytes / 1e6
        lines.append(f"{variant:<8}{result.provider:<22}{''.join(cells)}{size:>8.1f}  {result.passed}")
    lines.append("* enforced threshold, ° threshold recorded but not enforced (random weights)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.parity_table", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path)
    for folder in parser.parse_args(argv).folders:
        print(table(folder), end="\n\n")


if __name__ == "__main__":
    main()
