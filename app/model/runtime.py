"""Load an exported model and run its graphs: the ONNX Runtime side of the model interface.

Start-up checks the sha256 of every file it will use, picks the variant and execution providers, and
says in one log line what it chose and why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph as OrtInvalidGraph
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidProtobuf as OrtInvalidProtobuf

from app.model import allocator, pool, shaped
from app.model.manifest import (
    GRAPH_NAMES,
    HEAD_OUTPUT,
    MLM_INPUT,
    MLM_OUTPUT,
    POOLER_OUTPUT,
    SPARSE_INPUTS,
    SPARSE_OUTPUT,
    VNNI,
    GraphFile,
    Manifest,
    ManifestError,
    Variant,
    layer_output_name,
    load_manifest,
    verify_files,
)
from app.model.tokenizer import TextTokenizer
from app.settings import Settings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


# /proc/cpuinfo flags of an integer dot product that accumulates u8 x s8 in int32 (VPDPBUSD).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
# Rows of the masked-LM head in one run: its logits are [rows, vocab] (11 MB at 128 × 21128), and ONNX
# Runtime's arena keeps the most any run has needed, so more masks in a batch run in pieces of this many
# and the warm-up fills one piece: the head's memory is at its ceiling once a worker is ready.
MLM_ROWS = 128


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """This CPU's feature flags; none where ``cpuinfo`` cannot be read (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    return next(
        (set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set()
    )


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has VNNI, which an int8 graph with 256 activation levels needs to compute right.

    The export asks it to choose the graph's level count; the service, to refuse a graph it cannot run.
    No readable cpuinfo counts as no VNNI: the safe answer for both.
    """
    return not cpu_flags(cpuinfo).isdisjoint(VNNI_FLAGS)


def check_cpu(graph: GraphFile, has_vnni: bool) -> None:
    """Refuse a graph exported for VNNI on a CPU without it: its integer GEMMs would saturate, silently.

    Raises:
        ManifestError: one line that says so and how to fix it.
    """
    if graph.cpu == VNNI and not has_vnni:
        raise ManifestError(
            f"{graph.file} was exported for CPUs with VNNI ({graph.recipe.get('act_levels')} activation "
            f"levels) and would compute wrong vectors on this CPU, which has none of {', '.join(VNNI_FLAGS)}: "
            "export the model on this machine or one like it"
        )


@dataclass(frozen=True)
class Choice:
    variant: Variant
    providers: list[str]
    reason: str


def choose(manifest: Manifest, variant: str, providers: list[str] | None, available: list[str]) -> Choice:
    """Pick the variant and providers from the settings and what this machine offers.

    Raises:
        ManifestError: a requested variant or provider is not there.
    """
    if providers is None:
        chosen = [p for p in (CUDA, CPU) if p in available]
        why_providers = "auto providers: " + ("CUDA available" if CUDA in chosen else "no CUDA, CPU only")
    else:
        missing = [p for p in providers if p not in available]
        if missing:
            raise ManifestError(f"providers {missing} are not available here (available: {available})")
        chosen = list(providers)
        why_providers = "providers as configured"
    have = manifest.variants
    if not have:
        raise ManifestError("the manifest lists no encoder graphs")
    if variant == "auto":
        prefer: list[Variant] = ["fp16", "fp32", "int8"] if chosen[0] == CUDA else ["int8", "fp32", "fp16"]
        picked = next(v for v in prefer if v in have)
        why_variant = f"auto picks {picked} for {chosen[0]}"
        if picked != prefer[0]:
            why_variant += f" ({prefer[0]} was not exported)"
    elif variant in have:
        picked = variant
        why_variant = f"variant {picked} as configured"
    else:
        raise ManifestError(f"variant {variant} was not exported; the model folder has {have}")
    return Choice(picked, chosen, f"{why_variant}; {why_providers}")


def session_options(provider: str, intra_op_threads: int = 0, sessions: int = 1) -> ort.SessionOptions:
    """The service's ONNX Runtime session options for ``provider``; loadtest ceilings use these too, so a
    raw ceiling measures the service's own set-up.

    Args:
        provider: the first execution provider the session will use.
        intra_op_threads: ONNX Runtime intra-op threads; 0 lets it use every physical core.
        sessions: how many sessions of the model run one after the other on a batch (the encoder, its
            masked-LM head, its sparse graph). With more than one, each pool's threads stop spinning when
            its run returns: spinning on, they take the cores from the next session's threads (on 2 cores
            the encoder ran 45% slower beside the sparse graph, docs/performance-log.md).
    """
    options = ort.SessionOptions()
    if sessions > 1:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.intra_op_num_threads = intra_op_threads
    # One request stream runs one graph at a time; extra inter-op threads would only contend.
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if provider == CPU:
        # A memory pattern is planned and kept per input shape, and every batch shape is new: off, it
        # saves ~30 MB after a few hundred batches at no measured cost in speed (CPU, 2 threads).
        options.enable_mem_pattern = False
    return options


class OnnxModel:
    """The encoder (and masked-LM head) sessions of one variant, plus the tokenizer."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        choice: Choice,
        intra_op_threads: int,
        shared_pool: bool = False,
        grid: shaped.GridPlan | None = None,
    ) -> None:
        """``shared_pool``: on the process's one pool (:mod:`app.model.pool`); ``grid``: :mod:`app.model.shaped`."""
        self.folder = folder
        self.manifest = manifest
        self.variant = choice.variant
        self.reason = choice.reason
        self.tokenizer = TextTokenizer(folder, manifest.tokenizer)
        graphs = manifest.graphs
        head = graphs.get("mlm_head", {}).get(choice.variant) if manifest.config.has_mlm_head else None
        sparse = graphs.get("sparse", {}).get(choice.variant) if manifest.sparse is not None else None
        sessions = 1 + (head is not None) + (sparse is not None)
        options = session_options(choice.providers[0], intra_op_threads, sessions)
        # The intra-op threads its runs get (0: every physical core, ONNX Runtime's count).
        self.threads = intra_op_threads
        if shared_pool or pool.made():  # (once made, ONNX Runtime refuses a session a pool of its own)
            self.threads = pool.share(options, intra_op_threads)
        encoder = manifest.graphs["encoder"][choice.variant]
        providers = shaped.providers(choice.providers, grid)  # with CUDA graphs, its own option
        self._encoder = ort.InferenceSession(str(folder / encoder.file), options, providers=providers)
        self.providers: list[str] = self._encoder.get_providers()
        self._outputs = {o.name for o in self._encoder.get_outputs()}
        # (1-based layer, mode) → the encoder output with that pooled vector, where the graph has it.
        self._pooled: dict[tuple[int, str], str] = {
            (layer, mode): name
            for mode, per_layer in manifest.pooled_outputs.items()
            for layer, name in per_layer.items()
            if name in self._outputs
        }
        self._mlm: ort.InferenceSession | None = None
        if head is not None:
            self._mlm = ort.InferenceSession(str(folder / head.file), options, providers=choice.providers)
        self._sparse: ort.InferenceSession | None = None
        if sparse is not None:
            self._sparse = ort.InferenceSession(str(folder / sparse.file), options, choice.providers)
        self.shapes = shaped.build(self, self._encoder, grid) if grid is not None else None
        return_freed_memory()

    @property
    def num_layers(self) -> int:
        return self.manifest.config.num_layers

    @property
    def hidden_size(self) -> int:
        return self.manifest.config.hidden_size

    @property
    def has_pooler(self) -> bool:
        return self.manifest.config.has_pooler and POOLER_OUTPUT in self._outputs

    @property
    def has_mlm_head(self) -> bool:
        return self._mlm is not None

    @property
    def has_sparse(self) -> bool:
        """Whether the export has the SPLADE graph (``python -m export --sparse``, or a SparseEncoder folder)."""
        return self._sparse is not None

    @property
    def has_head(self) -> bool:
        """Whether the encoder returns a fine-tuned head's logits (``HEAD_OUTPUT``)."""
        return self.manifest.head is not None and HEAD_OUTPUT in self._outputs

    def output_name(self, layer: int) -> str:
        return self.manifest.layer_outputs.get(layer) or layer_output_name(layer, self.num_layers)

    def pooled_output(self, layer: int, mode: str) -> str | None:
        """The encoder output holding 1-based ``layer``'s ``mode``-pooled ("cls", "mean") vector
        [batch, hidden], computed in the graph; None when the graph has none (pool its token states then).
        """
        return self._pooled.get((layer, mode))

    def encode(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        outputs: list[str],
        token_type_ids: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Run the encoder on one padded batch and return only ``outputs``, in that order
        (``token_type_ids`` all 0 unless given: sentence pairs); on the grid, :mod:`app.model.shaped`'s."""
        if self.shapes is not None:
            return self.shapes.encode(input_ids, attention_mask, outputs, token_type_ids)
        feed = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids if token_type_ids is not None else np.zeros_like(input_ids),
        }
        return list(self._encoder.run(outputs, feed))

    def mask_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Masked-LM logits [k, vocab] for last-layer hidden states [k, hidden]."""
        if self._mlm is None:
            raise RuntimeError("mask_logits called on a model without a masked-LM head")
        hidden = hidden.astype(np.float32, copy=False)
        pieces = [
            self._mlm.run([MLM_OUTPUT], {MLM_INPUT: hidden[start : start + MLM_ROWS]})[0]
            for start in range(0, len(hidden), MLM_ROWS)
        ]
        return np.asarray(pieces[0]) if len(pieces) == 1 else np.concatenate(pieces)

    def sparse_vectors(self, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """SPLADE vectors [k, vocab] of sequences' last hidden states [k, seq, hidden] and mask [k, seq]."""
        if self._sparse is None:
            raise RuntimeError("sparse_vectors called on a model without the sparse graph")
        feed = dict(zip(SPARSE_INPUTS, (hidden.astype(np.float32, copy=False), attention_mask), strict=True))
        (vectors,) = self._sparse.run([SPARSE_OUTPUT], feed)
        return np.asarray(vectors)


def return_freed_memory() -> None:
    """Give the freed heap back to the OS (glibc keeps it otherwise); the export stage calls it too.

    Loading: ONNX Runtime parses each graph, repacks the int8 weights for its GEMM and frees the parsed copies,
    but glibc keeps the freed pages: trimming takes the service on the bert-base-chinese twin (int8,
    warm-up off) from 331 MB to 241 MB resident after start (VmRSS).
    """
    allocator.trim()


def check_model(settings: Settings) -> tuple[Path, Manifest, Choice]:
    """Resolve (exporting on first use) and verify the model the settings name, without loading it.

    ``python -m app`` with several workers calls this once before they start, so a hub model is
    exported once and a broken one stops the server with one message.

    Returns:
        The model folder, its manifest and the variant and providers chosen.

    Raises:
        ManifestError: the model is missing, corrupt, or cannot run with these settings; one message.
    """
    from app.model.resolve import resolve_model

    folder = resolve_model(settings.model, settings.revision, settings.cache_path)
    manifest = load_manifest(folder)
    choice = choose(manifest, settings.variant, settings.provider_list, ort.get_available_providers())
    files = manifest.files()
    for graph in GRAPH_NAMES:
        entry = manifest.graphs.get(graph, {}).get(choice.variant)
        if entry is not None:
            files[entry.file] = entry.sha256
    if "tokenizer.json" not in files:
        raise ManifestError(f"the manifest in {folder} does not list tokenizer.json")
    for per_variant in manifest.graphs.values():
        if choice.variant in per_variant:
            check_cpu(per_variant[choice.variant], cpu_has_vnni())
    verify_files(folder, files)
    return folder, manifest, choice


def load_model(settings: Settings, shared_pool: bool = False) -> OnnxModel:
    """Resolve, verify and load the model the settings name (``shared_pool``: on the process's one thread
    pool, :mod:`app.model.pool`).

    Raises:
        ManifestError: the model is missing, corrupt, or cannot run with these settings; one message.
    """
    return _open(settings, *check_model(settings), shared_pool)


def _open(
    settings: Settings, folder: Path, manifest: Manifest, choice: Choice, shared_pool: bool
) -> OnnxModel:
    """The sessions of a model :func:`check_model` verified.

    Raises:
        ManifestError: ONNX Runtime cannot load its graphs.
    """
    allocator.configure(settings.mmap_threshold_kb)  # before the sessions: loading allocates the most
    try:
        grid = shaped.plan(settings, choice.providers[0], manifest.tokenizer.max_length)
        model = OnnxModel(folder, manifest, choice, settings.intra_op_threads, shared_pool, grid)
    # InvalidProtobuf: a graph whose bytes are not ONNX at all (its sha256 may still match a bad export).
    except (OrtFail, OrtInvalidGraph, OrtInvalidProtobuf) as exc:
        raise ManifestError(
            f"ONNX Runtime cannot load the {choice.variant} graphs in {folder}: {exc}"
        ) from exc
    log.info(
        "model %s (%s weights) from %s: variant %s on %s — %s",
        manifest.source.model,
        manifest.source.weights,
        folder,
        model.variant,
        ",".join(model.providers),
        model.reason,
    )
    return model


@contextmanager
def named(name: str | None) -> Iterator[None]:
    """A :class:`ManifestError` raised within says which model of several it is about (``name``; None:
    the one model of a service of one, whose messages stay as they are)."""
    try:
        yield
    except ManifestError as exc:
        if name is None:
            raise
        raise ManifestError(f"model {name}: {exc}") from exc


def load_models(settings: Settings) -> list[OnnxModel]:
    """Resolve and verify every model the settings name (:meth:`Settings.model_entries`), then load them, in
    order; several share the process's one thread pool.

    Raises:
        ManifestError: the first model that is missing, corrupt or cannot run (before any is loaded, unless
            ONNX Runtime refuses its graphs); its message names it.
    """
    entries = settings.model_entries()
    checked = []
    for name, own in entries:
        with named(name):
            checked.append(check_model(own))
    models = []
    for (name, own), (folder, manifest, choice) in zip(entries, checked, strict=True):
        with named(name):
            models.append(_open(own, folder, manifest, choice, shared_pool=len(entries) > 1))
    return models


def check_models(settings: Settings) -> list[Path]:
    """Resolve (exporting on first use) and verify every model the settings name, without loading them:
    their folders, in order (``python -m app`` with several workers, before any starts).

    Raises:
        ManifestError: the first model that is missing, corrupt or cannot run; its message names it.
    """
    folders = []
    for name, own in settings.model_entries():
        with named(name):
            folders.append(check_model(own)[0])
    return folders
