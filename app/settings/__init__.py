"""One frozen settings object, built once at start-up from ``ZHEMBED_*`` variables and flags.

Each field's description is its ``--help`` text; a flag ``--max-batch-tokens`` and the variable
``ZHEMBED_MAX_BATCH_TOKENS`` set the same field (a flag wins). Nothing here reads the environment
outside ``Settings()`` / ``Settings.from_cli()``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from app.settings.keys import SettingsError, key_entries
from app.settings.models import PER_MODEL, entries, fold_model_flags

VariantChoice = Literal["auto", "fp32", "fp16", "int8"]

__all__ = ["Settings", "SettingsError", "VariantChoice"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ZHEMBED_",
        frozen=True,
        extra="ignore",
        cli_kebab_case=True,
        cli_prog_name="python -m app",
        cli_implicit_flags=True,
    )

    # --- model ---------------------------------------------------------------------------------------
    model: str = Field(
        default="bert-base-chinese",
        description="A folder holding manifest.json, or a hub id (from HF_ENDPOINT when it names a hub "
        "mirror), modelscope:ORG/NAME (from ModelScope; the modelscope extra) or plain model folder, "
        "exported on first use into --cache-dir (by `python -m export` in a subprocess).",
    )
    revision: str | None = Field(
        default=None,
        description="Hub or ModelScope revision to export when --model is a hub or ModelScope id.",
    )
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The model's name to clients: the `model` of /v1/embeddings answers, the one entry of "
        "/v1/models, /info's model_id and the model_info metric's label. Default: the hub id the model was "
        "exported from (bert-base-chinese), or the source folder's name for a local one; never a path.",
    )
    # The models of a service of several (issue 33): each a source as --model takes it, with its own options.
    models: str | None = Field(
        default=None,
        description="Several models in one service: NAME=SOURCE entries, comma-separated, each SOURCE as "
        "--model takes it, optionally followed by ;OPTION=VALUE for what differs from the settings here: "
        f"{', '.join(PER_MODEL)} (max_concurrent_inputs: the model's admission budget; by default the "
        "process's split evenly among the models without one). NAME is what a request's `model` names; "
        "the first is the default. Also given as repeated --model NAME=SOURCE flags. Set, it names every "
        "model: model and served-model-name are not read. Unset: one model, --model.",
    )
    cache_dir: Path = Field(
        default=Path("~/.cache/zhembed"), description="Where models given as hub ids are exported to."
    )
    variant: VariantChoice = Field(
        default="auto", description="Graph variant: auto (fp16 on CUDA, int8 on CPU), fp32, fp16 or int8."
    )
    providers: str = Field(
        default="auto",
        description="Comma-separated ONNX Runtime execution providers in order of preference; auto = "
        "CUDAExecutionProvider when available, then CPUExecutionProvider.",
    )
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="ONNX Runtime intra-op threads; 0 lets ONNX Runtime use every physical core, and with "
        "several models their one shared pool every physical core but one (the other models' short batches, "
        "the event loop and tokenisation run beside a long batch).",
    )
    warmup: bool = Field(
        default=True, description="Run a few batches of typical shapes before /ready turns true."
    )
    # Every batch allocates and frees its activations; glibc left alone keeps what is freed, and a worker
    # grew 2-4 MB a minute for as long as it served (app/model/allocator.py, docs/performance-log.md).
    mmap_threshold_kb: int = Field(
        default=128,
        ge=0,
        description="Heap blocks of this many KiB or more are mapped on their own and unmapped when freed "
        "(glibc's M_MMAP_THRESHOLD, fixed); 0 leaves glibc's own rule, which raises it as large blocks are "
        "freed, so a batch's activations stay in the heap and fragment it.",
    )
    memory_trim_batches: int = Field(
        default=64,
        ge=0,
        description="Every this many batches the inference thread gives the heap's free pages back to the "
        "OS (malloc_trim); 0: never.",
    )

    # --- server --------------------------------------------------------------------------------------
    host: str = Field(default="0.0.0.0", description="Address to listen on.")
    # Each worker is a whole service (its own session, tokeniser and event loop) on one shared listening
    # socket: the Python around a batch then runs on several cores while the GPU computes. On CPU the
    # cores belong to ONNX Runtime, so auto is 1 there.
    workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Worker processes behind the one port; 0 = auto: 4 with CUDA, 1 on CPU. With several, "
        "admission permits, readiness and /metrics span all of them; each has its own in-process cache.",
    )
    port: int = Field(default=8080, ge=1, le=65535, description="Port to listen on.")
    grpc_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port for gRPC (text-embeddings-inference's tei.v1 services, zhembed.v1, health and "
        "reflection) beside HTTP, in the same process and workers; unset: no gRPC.",
    )
    # Twice the default admission budget: every call admitted at once, and as many again being read,
    # written or refused. Each holds at most one request's inputs or answer (the request limits).
    grpc_max_concurrent_rpcs: int = Field(
        default=1024,
        ge=1,
        description="gRPC calls (streams included) one worker serves at once; beyond it a call is refused "
        "RESOURCE_EXHAUSTED before any of it is read.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text lines, or one JSON object per line with one line per request (route, status, "
        "inputs, tokens, timings, trace id; never a text or a key).",
    )
    # A safety net under the container's memory limit, for memory that grows over days: set it so that
    # every worker at the bound plus one freshly started worker fit in the limit.
    worker_max_memory_mb: int = Field(
        default=0,
        ge=0,
        description="Memory bound per worker process in MB (PSS, as /proc/PID/smaps_rollup counts it; host "
        "memory, not the GPU's); 0 = none. A worker past it is replaced: its replacement starts first, and "
        "once that is ready the old one stops accepting, serves the connections it holds and exits, so "
        "no fewer workers serve and no request is refused. With it set, one worker runs under the "
        'supervisor too. Logged, and counted in zhembed_worker_replacements_total{reason="memory"}.',
    )
    # Kubernetes: keep drain + grace under terminationGracePeriodSeconds minus the preStop sleep.
    shutdown_drain_s: float = Field(
        default=2.0,
        ge=0,
        description="After SIGTERM, seconds the listener stays open answering 503 (and /ready false) so "
        "load balancers stop sending; requests already accepted go on. Then the listener closes.",
    )
    shutdown_grace_s: float = Field(
        default=25.0,
        gt=0,
        description="After SIGTERM, the most seconds until the process exits 0: the drain, then the "
        "requests still in flight finish; any left past it are cancelled.",
    )
    # Longer than the idle timeout of the load balancers and clients in front (60 s for most): a server
    # that closes an idle connection first races the client's next request on it, which then fails.
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="Seconds an idle keep-alive connection stays open.",
    )

    # --- batching ------------------------------------------------------------------------------------
    # Measured on 2 CPU cores: batches of 8 run faster per input than batches of 32 (cache-bound), and
    # grouping by length saves ~2.5x; raise both on CUDA (e.g. 64 and 32768).
    max_batch_tokens: int = Field(
        default=4096,
        ge=1,
        description="Token budget of one batch, padding included: batch size × longest ≤ this.",
    )
    max_batch_size: int = Field(default=8, ge=1, description="Most inputs in one batch.")
    # A batch's activations grow with size × longest² (the attention's scores); the ONNX Runtime arena keeps
    # the most any batch has needed, so this bound is a worker's memory ceiling (docs/performance-log.md,
    # issue 31 step 17). On CUDA the device's memory is another matter: no bound unless set.
    max_batch_attention: int | None = Field(
        default=None,
        ge=0,
        description="Attention budget of one batch: batch size × longest² ≤ this, which bounds what a "
        "batch holds in memory (the warm-up runs the largest batch it allows, so a worker's memory is at "
        "its ceiling once ready). Unset: 524288 (8 × 256²; at 512 tokens, 2 a batch) on CPU, none on CUDA; "
        "0: none.",
    )
    # On CUDA a new input shape's first run cost ~37 ms, the same shape again 1.4 ms (issue 52).
    shape_grid: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Pad each batch to a grid shape (lengths to a multiple of 16 up to 128, of 32 beyond; "
        "rows to a power of two), each shape run once before /ready, the padding charged by the cost model. "
        "auto: on for CUDA, off on CPU (exact shapes).",
    )
    io_binding: bool = Field(
        default=True,
        description="On the grid, run batches that want only pooled vectors through IOBinding on fixed "
        "buffers per shape.",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="On CUDA with the grid and IOBinding, capture each shape of at most cuda-graph-max-rows "
        "rows as a CUDA graph at warm-up and replay it after (enable_cuda_graph, gpu_graph_id).",
    )
    cuda_graph_max_rows: int = Field(
        default=16, ge=1, description="The most rows of a grid shape captured as a CUDA graph."
    )
    max_wait_ms: float = Field(
        default=2.0,
        ge=0,
        description="How long a batch that is not full waits for company when the queue is nearly empty.",
    )
    measure_batch_cost: bool = Field(
        default=True,
        description="Before the first batch, time the encoder over a small grid of batch sizes x sequence "
        "lengths (3 s at most) and fit what a batch costs here (a + B*(b + c*S + d*S^2) seconds; shown in "
        "/info's batching.cost_model); the assembler picks the batches that do the most work per second by "
        "it. Measured once per graph, provider, ONNX Runtime version, threads and CPU or GPU, and cached in "
        "the model folder's batch_costs/ (or --cache-dir's, where the model folder is read-only): a restart "
        "reads it. Off: batch-overhead-tokens stands in for it.",
    )
    # On 2 CPU cores the int8 encoder runs b=8 about 9% faster per sentence than b=4 at equal padding
    # (python -m loadtest.raw_onnx). A GPU, whose batches cost little per token, wants ~1000.
    batch_overhead_tokens: int = Field(
        default=16,
        ge=0,
        description="With measure-batch-cost off: what one more batch costs beyond its tokens, in tokens "
        "(a batch then costs its tokens, padding included, plus this).",
    )
    max_queue_delay_ms: float | None = Field(
        default=None,
        gt=0,
        description="The queue-delay budget: an input that has waited this long for its batch is never "
        "passed over again (the next batch of its urgency holds it); a batch of less urgent work, while "
        "more urgent work is about, costs at most this; a batch takes less urgent inputs along only as far "
        "as its oldest input's budget allows. Unset: derived from the cost model, half the modelled time of "
        "one full batch (max-batch-size inputs, or as many as max-batch-tokens allows) of the mean length "
        "seen, in seconds as the batches actually run (/info: batching.queue_delay_budget_ms).",
    )
    urgency_aging_ms: float = Field(
        default=1000.0,
        gt=0,
        description="Waiting work counts one urgency level more urgent for each this long since its "
        "urgency was last served, so background requests (Priority u=7) run even while interactive "
        "ones never pause: after 4 s a u=7 batch ranks with u=3 work.",
    )
    background_share: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Background's floor: work less urgent than the default (Priority u=4 to u=7) gets at "
        "least this share of the engine's modelled time while more urgent work keeps it busy, in small "
        "batches between the urgent ones, its requests served whole and the oldest first; 0: none (aging "
        "alone).",
    )

    express_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="With several models: while one model's batch runs, another's due batch at least as "
        "urgent runs beside it on an express thread (one per model but one) if modelled to take at most "
        "this share of the running batch's time (so a tagger's 1 ms batch need not wait out an embedder's "
        "40 ms one); 0: one batch at a time.",
    )

    # --- limits --------------------------------------------------------------------------------------
    max_concurrent_inputs: int = Field(
        default=512,
        ge=1,
        description="Inputs admitted at once across all requests; beyond it requests get 429. Less urgent "
        "requests are refused sooner, from one budget: urgency 4 at 7/8 of it, 5 at 6/8, 6 at 5/8, 7 "
        "(background) at half.",
    )
    max_inputs_per_request: int = Field(default=64, ge=1, description="Most inputs in one request.")
    max_input_chars: int = Field(default=8192, ge=1, description="Most characters in one input.")
    # A token vector is hidden_size numbers (768), ~10 bytes each as JSON: 4096 of them are ~30 MB of
    # float JSON, eight inputs of bert-base-chinese's full length.
    max_embed_all_tokens: int = Field(
        default=4096,
        ge=1,
        description="Most token vectors one /embed_all request may hold: each token returned counts once "
        "per layer asked for, whatever layer_combine (every layer's rows are held before they are mixed); "
        "beyond it the request gets 422.",
    )
    # A token is ~60 bytes of /tokenize JSON ({"id", "text", "special", "start", "stop"}) and a dict built
    # for it (~1 µs): 65,536 are ~4 MB and ~60 ms off the event loop; without it 64 inputs of 8192
    # characters could ask for half a million.
    max_tokenize_tokens: int = Field(
        default=65536,
        ge=1,
        description="Most tokens one /tokenize request (or gRPC Tokenize call) may return, over all its "
        "inputs; beyond it the request gets 422.",
    )
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1,
        description="Largest request body; larger ones are refused unread (413).",
    )

    # --- cache ---------------------------------------------------------------------------------------
    cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Bytes the in-process vector cache may hold (LRU); 0 turns it off. A 768-float vector "
        "costs about 3.3 kB with its key.",
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="Redis shared by replicas as a second cache tier, e.g. redis://cache:6379/0; unset = "
        "no Redis. A Redis fault never fails a request: it is counted and the cache skipped.",
    )
    cache_ttl_s: int = Field(default=7 * 24 * 3600, ge=1, description="Lifetime of a vector in Redis.")
    redis_timeout_ms: float = Field(
        default=50.0,
        gt=0,
        description="Connect and read timeout of one Redis call; past it the request goes on without Redis.",
    )
    redis_max_backoff_s: float = Field(
        default=5.0,
        gt=0,
        description="After a Redis fault it is skipped for 0.1 s, doubling on each further fault up to this.",
    )

    # --- API keys -------------------------------------------------------------------------------------
    api_keys: SecretStr | None = Field(
        default=None,
        description="Comma-separated API keys, or @path to a file of keys (one per line or comma-separated). "
        "Lines starting with # are ignored. When set, data routes need `Authorization: Bearer <key>`. A key "
        "written as key:u=N (N 0-7) gives its requests urgency N unless they send a Priority header with "
        "one (e.g. bulk-indexing:u=7 for background work; 3 is the default, lower is more urgent).",
    )
    auth_ops_routes: bool = Field(
        default=False,
        description="With api-keys set, also require a key on /metrics, /health, /ready and the API docs.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.max_inputs_per_request > self.max_concurrent_inputs:
            raise ValueError(
                f"max_inputs_per_request ({self.max_inputs_per_request}) exceeds max_concurrent_inputs "
                f"({self.max_concurrent_inputs}): such a request could never be admitted"
            )
        self.model_entries()  # a malformed entry stops the start here
        if self.shutdown_drain_s > self.shutdown_grace_s:
            raise ValueError(
                f"shutdown_drain_s ({self.shutdown_drain_s}) exceeds shutdown_grace_s ({self.shutdown_grace_s})"
            )
        return self

    def model_entries(self) -> tuple[tuple[str | None, Settings], ...]:
        """Each model's name (None for the one model of --model) and its settings
        (:func:`app.settings.models.entries`); the first is the default model.

        Raises:
            ValueError: an entry is malformed, a name repeats, or the budgets do not fit the total.
        """
        return entries(self)

    @property
    def provider_list(self) -> list[str] | None:
        """The requested providers, or None for auto."""
        if self.providers.strip().lower() == "auto":
            return None
        return [p.strip() for p in self.providers.split(",") if p.strip()]

    @property
    def cache_path(self) -> Path:
        return self.cache_dir.expanduser()

    def api_key_values(self) -> tuple[str, ...]:
        """The configured API keys (read from the file for ``@path``); empty when keys are off.

        Raises:
            SettingsError: the file cannot be read, the setting names no keys, or a key's urgency is bad.
        """
        return tuple(key for key, _ in self.api_key_entries())

    def api_key_entries(self) -> tuple[tuple[str, int | None], ...]:
        """Each configured key with its default urgency (``key:u=N``), None where it names none.

        Raises:
            SettingsError: the file cannot be read, the setting names no keys, or a key's urgency is bad.
        """
        return key_entries(self.api_keys)

    @classmethod
    def from_cli(cls, args: list[str] | None = None) -> Settings:
        """Settings from flags (``args``, default ``sys.argv[1:]``) over ``ZHEMBED_*`` variables; repeated
        ``--model NAME=SOURCE`` flags are the entries of ``--models``."""
        args = fold_model_flags(list(sys.argv[1:] if args is None else args))
        return CliApp.run(cls, cli_args=args)
