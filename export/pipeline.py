"""The export, stage by stage: resolve → load → tokenizer → fp32 graphs → variants → validate → manifest.

Everything is written into a temporary folder beside ``--out`` and renamed into place only after every
variant passed validation, so a failed or interrupted export leaves ``--out`` as it was.
"""

from __future__ import annotations

import datetime as dt
import gc
import importlib.metadata
import os
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from app.model.manifest import (
    GRAPH_NAMES,
    LAST_HIDDEN_STATE,
    MLM_INPUT,
    SPARSE_INPUTS,
    VARIANTS,
    GraphFile,
    GraphName,
    Manifest,
    ManifestError,
    ModelConfig,
    Source,
    Sparse,
    SparsePoolingStrategy,
    TensorSpec,
    TokenizerInfo,
    Validation,
    Variant,
    layer_output_name,
    load_manifest,
    sha256_file,
    verify_files,
)
from app.model.runtime import return_freed_memory
from export import graphs, heads, matryoshka, sentence, source, validate, variants
from export.spec import DEFAULT_MODEL, DEFAULT_OPSET, INT8_RECIPE, PROVIDERS, THRESHOLDS, Threshold

Log = Callable[[str], None]


@dataclass(frozen=True)
class ExportOptions:
    out: Path
    model: str = DEFAULT_MODEL
    revision: str | None = None
    variants: tuple[Variant, ...] = VARIANTS
    opset: int = DEFAULT_OPSET
    twin: bool = False
    force: bool = False
    # --matryoshka-dimensions: declares what the checkpoint's config.json does not (None: read it there).
    matryoshka_dimensions: matryoshka.Declared = None
    # --sparse: add the SPLADE graph to a model with a masked-LM head, pooling by max or sum (TEI's
    # --pooling splade); a SparseEncoder folder gets it from its SpladePooling without the flag.
    sparse: SparsePoolingStrategy | None = None

    def fingerprint_fields(self) -> dict[str, object]:
        fields: dict[str, object] = {
            "variants": sorted(self.variants),
            "opset": self.opset,
            "twin": self.twin,
            "revision": self.revision,
            "int8_recipe": INT8_RECIPE.describe(),
        }
        if self.matryoshka_dimensions is not None:  # only then: every other export keeps its fingerprint
            fields["matryoshka"] = matryoshka.as_flag(self.matryoshka_dimensions)
        if self.sparse is not None:
            fields["sparse"] = self.sparse
        return fields


@dataclass
class _Clock:
    log: Log
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str, sizes: Callable[[], str] | None = None) -> Iterator[None]:
        start = time.perf_counter()
        yield
        took = time.perf_counter() - start
        self.timings[name] = round(took, 3)
        _release_memory()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
        self.log(
            f"[export] {name:<26} {took:7.2f} s  peak RSS {peak:4.1f} GB{'  ' + sizes() if sizes else ''}"
        )


def _release_memory() -> None:
    """Hand freed memory back to the OS between steps, so peaks do not stack."""
    gc.collect()
    return_freed_memory()


def _mb(*paths: Path) -> str:
    return ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in paths)


def _versions() -> dict[str, str]:
    names = [
        "zhembed",
        "torch",
        "transformers",
        "optimum",
        "optimum-onnx",
        "onnx",
        "onnxruntime",
        "tokenizers",
    ]
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def _graph_file(
    folder: Path,
    name: str,
    variant: Variant,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    recipe: dict[str, str | bool | int],
) -> GraphFile:
    path = folder / name
    return GraphFile(
        file=name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        dtype=variant,
        provider=PROVIDERS[variant],
        inputs=inputs,
        outputs=outputs,
        recipe=recipe,
    )


def _up_to_date(out: Path, fingerprint: str, declared: matryoshka.Declared) -> Manifest | None:
    try:
        manifest = load_manifest(out)
        if manifest.source.fingerprint != fingerprint:
            return None
        # An export from before the manifest recorded Matryoshka training reads as untrained: exported
        # again if the source declares it (the fingerprint, over the same config.json, cannot tell).
        if (manifest.defaults.matryoshka, manifest.defaults.matryoshka_dimensions) != matryoshka.recorded(
            declared
        ):
            return None
        files = {g.file: g.sha256 for per in manifest.graphs.values() for g in per.values()}
        verify_files(out, files | manifest.files())
    except ManifestError:
        return None
    return manifest


def _swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)


def run_export(
    options: ExportOptions,
    log: Log = print,
    thresholds: dict[Variant, tuple[Threshold, ...]] = THRESHOLDS,
) -> Manifest:
    """Export, validate and install a model folder.

    Args:
        options: what to export and where.
        log: receives one line per step.
        thresholds: parity thresholds (tests pass impossible ones to prove a miss fails the export).

    Returns:
        The manifest now in ``options.out`` (the existing one when nothing changed).

    Raises:
        source.ExportError: the source cannot be found or loaded, or validation failed
            (``validate.ValidationFailedError``, listing every failing metric).
    """
    clock = _Clock(log)
    out = options.out.resolve()
    with clock.step("resolve source"):
        src = source.resolve(options.model, options.revision)
    # Hashed once here (the fingerprint and the manifest both use it); a 400 MB read is worth not repeating.
    weights_sha = None if options.twin else sha256_file(source.require_weights(src))
    fingerprint = source.fingerprint(src, weights_sha, options.fingerprint_fields())
    declared = options.matryoshka_dimensions or matryoshka.declared(src.folder)
    if not options.force and (existing := _up_to_date(out, fingerprint, declared)) is not None:
        log(f"[export] {out} is up to date (same source and options); pass --force to export again")
        return existing

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        manifest = _export_into(tmp, src, weights_sha, fingerprint, declared, options, clock, thresholds)
        _swap_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[export] wrote {out} ({', '.join(manifest.variants)}; weights {manifest.source.weights})")
    return manifest


def _calibration_feeds(
    tokenizer: PreTrainedTokenizerFast, fp32: dict[GraphName, Path]
) -> dict[GraphName, list[dict[str, np.ndarray]]]:
    """Inputs for int8 calibration: the calibration sentences, and for the head their last hidden states."""
    feeds = [b.feed() for b in validate.make_batches(tokenizer, validate.calibration_sentences())]
    out: dict[GraphName, list[dict[str, np.ndarray]]] = {"encoder": feeds}
    if "mlm_head" in fp32 or "sparse" in fp32:
        encoder = validate.session(fp32["encoder"], "CPUExecutionProvider")
        states = [encoder.run([LAST_HIDDEN_STATE], f)[0] for f in feeds]
        masks = [f["attention_mask"] for f in feeds]
        if "mlm_head" in fp32:
            out["mlm_head"] = [{MLM_INPUT: h[m.astype(bool)]} for h, m in zip(states, masks, strict=True)]
        if "sparse" in fp32:
            out["sparse"] = [
                dict(zip(SPARSE_INPUTS, hm, strict=True)) for hm in zip(states, masks, strict=True)
            ]
    return out


def _sparse(
    src: Path, options: ExportOptions, has_mlm: bool
) -> tuple[Sparse | None, sentence.SparseConfig | None]:
    """What the sparse graph computes, from a SparseEncoder folder's SpladePooling or ``--sparse``; None
    for none.

    Raises:
        source.ExportError: ``--sparse`` on a model without a masked-LM head, or against the folder's own
            pooling.
    """
    folder = sentence.read_sparse(src)
    if folder is not None and options.sparse is not None and options.sparse != folder.sparse.pooling:
        raise source.ExportError(
            f"--sparse {options.sparse} contradicts {src}'s SpladePooling ({folder.sparse.pooling}): leave "
            "the flag out to serve the folder as it was trained"
        )
    chosen = (
        folder.sparse if folder is not None else Sparse(pooling=options.sparse) if options.sparse else None
    )
    if chosen is not None and not has_mlm:
        raise source.ExportError(
            f"{src} has no masked-LM head (its checkpoint is not *ForMaskedLM or *ForPreTraining): sparse "
            "vectors need one"
        )
    return chosen, folder


def _export_into(
    tmp: Path,
    src: source.ResolvedSource,
    weights_sha: str | None,
    fingerprint: str,
    declared: matryoshka.Declared,
    options: ExportOptions,
    clock: _Clock,
    thresholds: dict[Variant, tuple[Threshold, ...]],
) -> Manifest:
    with clock.step("load PyTorch model"):
        loaded = source.load(src, options.twin)
    cfg = loaded.config
    num_heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    # A fine-tuned head is served as its checkpoint says; an encoder folder may be a sentence-transformers one.
    st = sentence.read(src.folder) if loaded.head is None else None
    max_length = cfg.max_position_embeddings
    if st is not None and st.max_seq_length is not None:
        max_length = min(max_length, st.max_seq_length)
    head = heads.head(loaded.head_architecture, cfg)
    modes = graphs.graph_modes(st.pooling if st is not None else None)
    sparse, sparse_folder = _sparse(src.folder, options, loaded.mlm_head is not None)
    if sparse_folder is not None and sparse_folder.max_seq_length is not None:
        max_length = min(max_length, sparse_folder.max_seq_length)

    with clock.step("save tokenizer"):
        tokenizer = source.load_tokenizer(src.folder, max_length)
        if (st is not None and st.do_lower_case) or (
            sparse_folder is not None and sparse_folder.do_lower_case
        ):
            sentence.lowercase(tokenizer)
        saved = tokenizer.save_pretrained(tmp)
        token_files = {Path(p).name: sha256_file(Path(p)) for p in saved if Path(p).is_file()}
        dense_layers, dense_files = sentence.save_dense(tmp, st.dense if st is not None else ())
    # Checked before any graph is made: a width the vectors do not have is the user's to fix.
    recorded = matryoshka.checked(declared, dense_layers[-1].out_features if dense_layers else hidden)

    scratch = tmp / "scratch"
    scratch.mkdir()
    names: dict[GraphName, str] = {g: f"{g}.{{}}.onnx" for g in GRAPH_NAMES}
    fp32: dict[GraphName, Path] = {"encoder": scratch / "encoder.fp32.onnx"}
    with clock.step("export encoder fp32", lambda: _mb(fp32["encoder"])):
        graphs.export_encoder(loaded, fp32["encoder"], options.opset, modes=modes)
    if loaded.mlm_head is not None:
        fp32["mlm_head"] = scratch / "mlm_head.fp32.onnx"
        with clock.step("export mlm_head fp32", lambda: _mb(fp32["mlm_head"])):
            graphs.export_mlm_head(loaded, fp32["mlm_head"], options.opset)
    if sparse is not None:
        fp32["sparse"] = scratch / "sparse.fp32.onnx"
        with clock.step("export sparse fp32", lambda: _mb(fp32["sparse"])):
            graphs.export_sparse(loaded, fp32["sparse"], options.opset, sparse)
    io: dict[GraphName, tuple[list[TensorSpec], list[TensorSpec]]] = {
        "encoder": (graphs.encoder_inputs(), graphs.encoder_outputs(loaded, modes=modes))
    }
    if loaded.mlm_head is not None:
        io["mlm_head"] = (graphs.mlm_inputs(loaded), graphs.mlm_outputs(loaded))
    if sparse is not None:
        io["sparse"] = (graphs.sparse_inputs(loaded), graphs.sparse_outputs(loaded))

    sentences = validate.validation_sentences()
    batches = validate.make_batches(tokenizer, sentences)
    calibration = _calibration_feeds(tokenizer, fp32) if "int8" in options.variants else {}
    with clock.step("PyTorch reference"):
        reference = validate.reference(loaded, batches, sparse)
    # From here on only ONNX Runtime sessions are held: one model in memory at a time.
    has_pooler, has_mlm, weights = loaded.has_pooler, loaded.mlm_head is not None, loaded.weights
    checks = validate.Checks(
        modes=modes,
        has_pooler=has_pooler,
        head_activation=head.activation if head is not None else None,
        token_head=loaded.head_architecture == "BertForTokenClassification",
        sentence_pooling=st.pooling if st is not None and st.dense else None,
        dense=st.dense if st is not None else (),
    )
    kind = heads.kind(loaded.head_architecture, cfg)
    del loaded
    gc.collect()

    files: dict[GraphName, dict[Variant, GraphFile]] = {g: {} for g in fp32}
    results: list[Validation] = []
    for variant in options.variants:
        for graph, src_path in fp32.items():
            dst = tmp / names[graph].format(variant)
            with clock.step(f"{graph} {variant}", lambda dst=dst: _mb(dst)):  # type: ignore[misc]
                if variant == "fp32":
                    shutil.copyfile(src_path, dst)
                    recipe: dict[str, str | bool | int] = {
                        "tool": "torch.onnx.export",
                        "opset": options.opset,
                    }
                elif variant == "fp16":
                    recipe = dict(
                        variants.to_fp16(src_path, dst, num_heads, hidden, fused=graph == "encoder")
                    )
                else:
                    recipe = dict(variants.to_int8(src_path, dst, num_heads, hidden, calibration[graph]))
            files[graph][variant] = _graph_file(tmp, dst.name, variant, *io[graph], recipe)
        provider = PROVIDERS[variant]
        with clock.step(f"validate {variant}"):
            encoder = validate.session(tmp / files["encoder"][variant].file, provider)
            mlm = validate.session(tmp / files["mlm_head"][variant].file, provider) if has_mlm else None
            splade = validate.session(tmp / files["sparse"][variant].file, provider) if sparse else None
            used = encoder.get_providers()[0]
            raw = validate.measure_sessions(
                cfg.num_hidden_layers, checks, batches, reference, encoder, mlm, splade
            )
            result = validate.judge(variant, used, len(sentences), raw, weights, thresholds)
            del encoder, mlm, splade
        # The per-output minima (cosine_min/mean_3) go to the manifest; the log line keeps to the totals.
        totals = {k: v for k, v in raw.items() if validate.PER_OUTPUT not in k}
        clock.log(f"[export]   {variant} on {used}: " + ", ".join(f"{k}={v:.6g}" for k, v in totals.items()))
        results.append(result)
    shutil.rmtree(scratch)

    missed = validate.failures(results)
    if missed:
        raise validate.ValidationFailedError("validation failed: " + "; ".join(missed))

    manifest = Manifest(
        source=Source(
            model=src.model,
            revision=src.revision,
            local=src.local,
            weights=weights,  # type: ignore[arg-type]
            weights_sha256=weights_sha,
            fingerprint=fingerprint,
        ),
        kind=kind,
        defaults=sentence.defaults(st, dense_layers, recorded),
        head=head,
        extra_files=dense_files,
        config=ModelConfig(
            architecture=head.architecture if head else "BertForPreTraining" if has_mlm else "BertModel",
            num_layers=cfg.num_hidden_layers,
            hidden_size=hidden,
            num_heads=num_heads,
            intermediate_size=cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            max_position_embeddings=max_length,
            type_vocab_size=cfg.type_vocab_size,
            has_pooler=has_pooler,
            has_mlm_head=has_mlm,
        ),
        tokenizer=TokenizerInfo(
            files=token_files,
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            pad_id=tokenizer.pad_token_id,
            mask_id=tokenizer.mask_token_id,
            unk_id=tokenizer.unk_token_id,
            max_length=max_length,
            do_lower_case=bool(getattr(tokenizer, "do_lower_case", False)),
        ),
        graphs=files,
        layer_outputs={
            i: layer_output_name(i, cfg.num_hidden_layers) for i in range(1, cfg.num_hidden_layers + 1)
        },
        pooled_outputs=graphs.pooled_outputs(cfg.num_hidden_layers, modes=modes),
        validation={r.variant: r for r in results},
        versions=_versions(),
        timings_s=clock.timings,
        options={
            "variants": list(options.variants),
            "opset": options.opset,
            "twin": options.twin,
            **{f"int8_{k}": v for k, v in INT8_RECIPE.describe().items()},
            **(
                {"matryoshka": matryoshka.as_flag(options.matryoshka_dimensions)}
                if options.matryoshka_dimensions
                else {}
            ),
        },
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        sparse=sparse,
    )
    manifest.dump(tmp)
    return manifest
