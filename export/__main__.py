"""``python -m export --model SRC --out DIR [--revision REV] [--variants fp32,fp16,int8] [--opset N]
[--twin] [--matryoshka-dimensions 768,256,64 | any] [--sparse max|sum] [--force]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from app.model.manifest import VARIANTS, Variant
from app.model.resolve import EXIT_EXPORT_ERROR, EXIT_HUB_UNREACHABLE
from export.matryoshka import ANY_WIDTH, Declared
from export.pipeline import ExportOptions, run_export
from export.source import ExportError, HubUnreachableError
from export.spec import DEFAULT_MODEL, DEFAULT_OPSET


def _variants(text: str) -> tuple[Variant, ...]:
    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"variants are a comma list of {', '.join(VARIANTS)}; got {text!r}")
    return tuple(v for v in VARIANTS if v in chosen)


def _matryoshka(text: str) -> Declared:
    if text.strip() == ANY_WIDTH:
        return ANY_WIDTH
    try:
        widths = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"matryoshka dimensions are a comma list of widths ≥ 1 (e.g. 768,256,64) or {ANY_WIDTH}; got {text!r}"
        )
    return widths


def parse_args(argv: list[str] | None = None) -> ExportOptions:
    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a Hugging Face BERT checkpoint to validated ONNX graphs and a manifest.",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="hub id (fetched from HF_ENDPOINT, a mirror, when the environment names one), "
        "modelscope:ORG/NAME (fetched from ModelScope; the modelscope extra), or local folder "
        "(default: %(default)s)",
    )
    parser.add_argument("--out", required=True, type=Path, help="model folder to write (replaced atomically)")
    parser.add_argument(
        "--revision",
        default=None,
        help="hub or ModelScope revision (branch, tag or commit; ModelScope's default: master)",
    )
    parser.add_argument(
        "--variants", type=_variants, default=VARIANTS, help="comma list of fp32,fp16,int8 (default: all)"
    )
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: %(default)s)")
    parser.add_argument(
        "--twin", action="store_true", help="random weights from SRC's config and tokenizer (benchmarks only)"
    )
    parser.add_argument(
        "--matryoshka-dimensions",
        type=_matryoshka,
        default=None,
        help="the checkpoint was trained for shorter vectors (Matryoshka loss) at these widths, or at any "
        f"('{ANY_WIDTH}'), though its config.json does not say so (matryoshka_dimensions, is_matryoshka): "
        "requests may then ask for dimensions",
    )
    parser.add_argument(
        "--sparse",
        choices=["max", "sum"],
        default=None,
        help="add the SPLADE graph (sparse vectors from the masked-LM head, pooled by max or sum over "
        "tokens; TEI's --pooling splade); a SparseEncoder folder has it from its SpladePooling",
    )
    parser.add_argument("--force", action="store_true", help="export even if --out is up to date")
    args = parser.parse_args(argv)
    return ExportOptions(
        out=args.out,
        model=args.model,
        revision=args.revision,
        variants=args.variants,
        opset=args.opset,
        twin=args.twin,
        force=args.force,
        matryoshka_dimensions=args.matryoshka_dimensions,
        sparse=args.sparse,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    # quantize_dynamic logs advice on the root logger at WARNING; errors are what matter here.
    logging.basicConfig(level=logging.ERROR)
    try:
        run_export(options)
    except HubUnreachableError as exc:
        print(f"export: error: {exc}", file=sys.stderr)
        return EXIT_HUB_UNREACHABLE
    except ExportError as exc:
        print(f"export: error: {exc}", file=sys.stderr)
        return EXIT_EXPORT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
