"""Locust load test for zhembed: embed, similarity, fill-mask and a cache-heavy mix.

Runs as its own process (``locust -f loadtest/locustfile.py`` from the project root); nothing imports it.
It needs only Locust, the standard library and :mod:`loadtest.corpus`, so it also runs in the stock
``locustio/locust`` image (docker-compose.yml).

User classes (all run, by weight, unless named on the command line):

- ``EmbedUser``       POST /embed, batches of 1, 4, 16 and 32 texts; some requests ask for layer mixes
- ``SimilarityUser``  POST /similarity, source-vs-sentences and pairs
- ``FillMaskUser``    POST /fill-mask, one or two [MASK]s per text
- ``CacheHeavyUser``  POST /embed where ``--repeat-ratio`` of the texts come from a small hot set

Load shapes, chosen with ``LOADTEST_SHAPE`` (read when the file is loaded, because Locust runs the
first shape it finds): ``step`` (``--step-users`` more users every ``--step-seconds``, ``--steps``
times), ``spike`` (``--base-users``, a jump to ``--spike-users`` for ``--spike-seconds``, back), ``all``
(both, for the web UI's ``--class-picker``), or unset (``-u``/``-r``/``-t`` as usual).

Text comes from ``loadtest/data/corpus_zh.txt`` (one sentence a line); ``LOADTEST_CORPUS`` names another
file. docs/deployment.md ("Load test") has the commands: headless with CSV and HTML reports, each shape.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

from locust import FastHttpUser, LoadTestShape, between, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment

from loadtest.corpus import CORPUS, load_corpus

# Characters a [MASK] may replace: CJK ideographs only, so the masked text still reads as a sentence.
_HAN = re.compile(r"[\u4e00-\u9fff]")
# Long enough for realistic sentences, short enough to fit any model's window (the CI test model has 128
# positions); /embed and /similarity also send longer texts with truncation or chunking on.
FILL_MASK_MAX_CHARS = 100

SENTENCES = load_corpus(Path(os.environ.get("LOADTEST_CORPUS") or CORPUS))


# The options this file adds, each also read from its environment variable (LOADTEST_ and its name):
# name -> (type, default, help).
OPTIONS: dict[str, tuple[type, object, str]] = {
    "repeat-ratio": (float, 0.9, "CacheHeavyUser: share of texts drawn from the hot set (0..1)"),
    "hot-set-size": (int, 32, "CacheHeavyUser: how many distinct texts the hot set holds"),
    "api-key": (str, "", "sent as 'Authorization: Bearer KEY' when set"),
    "step-users": (int, 8, "step shape: users added at each step"),
    "step-seconds": (int, 30, "step shape: seconds between steps"),
    "steps": (int, 5, "step shape: steps before it stops"),
    "base-users": (int, 4, "spike shape: users before and after the spike"),
    "spike-users": (int, 64, "spike shape: users during the spike"),
    "spike-after": (int, 30, "spike shape: seconds before the spike"),
    "spike-seconds": (int, 20, "spike shape: how long the spike lasts"),
    "spike-tail": (int, 30, "spike shape: seconds of base users after the spike"),
}


@events.init_command_line_parser.add_listener
def _add_arguments(parser: LocustArgumentParser) -> None:
    # On the parser itself, not a group: only LocustArgumentParser knows is_secret and the web UI fields.
    for name, (kind, default, what) in OPTIONS.items():
        env = "LOADTEST_" + name.upper().replace("-", "_")
        secret = name == "api-key"
        parser.add_argument(f"--{name}", type=kind, env_var=env, default=default, help=what, is_secret=secret)


def _options(environment: Environment) -> Any:
    if environment.parsed_options is None:
        raise RuntimeError("Locust started without parsed options")
    return environment.parsed_options


def _texts(n: int, rng: random.Random) -> list[str]:
    return [rng.choice(SENTENCES) for _ in range(n)]


def _masked(text: str, masks: int, rng: random.Random) -> str:
    """``text`` (clipped) with ``masks`` of its Han characters replaced by [MASK]."""
    text = text[:FILL_MASK_MAX_CHARS]
    spots = [m.start() for m in _HAN.finditer(text)]
    if not spots:
        return text + "[MASK]"
    chosen = sorted(rng.sample(spots, min(masks, len(spots))), reverse=True)
    for i in chosen:
        text = text[:i] + "[MASK]" + text[i + 1 :]
    return text


class _ZhembedUser(FastHttpUser):
    abstract = True
    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        self.rng = random.Random()
        key = _options(self.environment).api_key
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def post(self, path: str, body: dict[str, Any], name: str) -> None:
        """POST ``body``; anything but 200 with a JSON list is a failure."""
        with self.client.post(path, json=body, headers=self.headers, name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {(r.text or '')[:200]}")
                return
            try:
                payload = r.json()
            except ValueError:
                r.failure("response is not JSON")
                return
            if not isinstance(payload, list):
                r.failure(f"expected a JSON list, got {type(payload).__name__}")


class EmbedUser(_ZhembedUser):
    """Mixed batch sizes; most requests use the defaults, some ask for layer mixes or other encodings."""

    weight = 4

    @task(6)
    def embed_one(self) -> None:
        self.post("/embed", {"inputs": self.rng.choice(SENTENCES), "truncate": True}, "/embed [1]")

    @task(4)
    def embed_4(self) -> None:
        self.post("/embed", {"inputs": _texts(4, self.rng), "truncate": True}, "/embed [4]")

    @task(2)
    def embed_16(self) -> None:
        body = {"inputs": _texts(16, self.rng), "truncate": True, "pooling": "mean"}
        self.post("/embed", body, "/embed [16]")

    @task(1)
    def embed_32_layers(self) -> None:
        body = {
            "inputs": _texts(32, self.rng),
            "layers": [-1, -2],
            "layer_combine": "mean",
            "long_text": "chunk",
            "encoding": "base64",
        }
        self.post("/embed", body, "/embed [32, layers]")


class SimilarityUser(_ZhembedUser):
    weight = 2

    @task(2)
    def source_sentences(self) -> None:
        sentences = _texts(self.rng.choice((4, 8, 16)), self.rng)
        body = {"inputs": {"source_sentence": self.rng.choice(SENTENCES), "sentences": sentences}}
        self.post("/similarity", {**body, "truncate": True}, "/similarity [source]")

    @task(1)
    def pairs(self) -> None:
        pairs = [_texts(2, self.rng) for _ in range(self.rng.choice((1, 4, 8)))]
        self.post("/similarity", {"pairs": pairs, "truncate": True}, "/similarity [pairs]")


class FillMaskUser(_ZhembedUser):
    weight = 1

    @task(3)
    def one_mask(self) -> None:
        body = {"inputs": _masked(self.rng.choice(SENTENCES), 1, self.rng), "top_k": 5}
        self.post("/fill-mask", body, "/fill-mask [1 mask]")

    @task(1)
    def batch_two_masks(self) -> None:
        texts = [_masked(t, 2, self.rng) for t in _texts(4, self.rng)]
        self.post("/fill-mask", {"inputs": texts, "top_k": 10}, "/fill-mask [4 x 2 masks]")


class CacheHeavyUser(_ZhembedUser):
    """Callers that repeat themselves: ``--repeat-ratio`` of the texts come from a small hot set."""

    weight = 3

    def on_start(self) -> None:
        super().on_start()
        options = _options(self.environment)
        if not 0.0 <= options.repeat_ratio <= 1.0:
            raise ValueError(f"--repeat-ratio must be within 0..1, got {options.repeat_ratio}")
        # The same seed in every user, so all users (and workers) share one hot set.
        self.hot = random.Random(1234).sample(SENTENCES, min(options.hot_set_size, len(SENTENCES)))
        self.repeat_ratio = options.repeat_ratio

    def _text(self) -> str:
        if self.rng.random() < self.repeat_ratio:
            return self.rng.choice(self.hot)
        # A cold text: a corpus sentence with a random suffix, so it has never been seen before.
        return f"{self.rng.choice(SENTENCES)}（{self.rng.randrange(10**9)}）"

    @task(3)
    def embed_one(self) -> None:
        self.post("/embed", {"inputs": self._text(), "truncate": True}, "/embed [cache-heavy 1]")

    @task(1)
    def embed_8(self) -> None:
        body = {"inputs": [self._text() for _ in range(8)], "truncate": True}
        self.post("/embed", body, "/embed [cache-heavy 8]")


# --- load shapes ------------------------------------------------------------------------------------------

SHAPE = os.environ.get("LOADTEST_SHAPE", "").strip().lower()
if SHAPE not in ("", "step", "spike", "all"):
    raise SystemExit(f"LOADTEST_SHAPE is step, spike or all; got {SHAPE!r}")


class StepLoadShape(LoadTestShape):
    """``--step-users`` more users every ``--step-seconds``, ``--steps`` times, then stop."""

    abstract = SHAPE not in ("step", "all")

    def tick(self) -> tuple[int, float] | None:
        options = _options(self.runner.environment) if self.runner else None
        if options is None:
            return None
        step = int(self.get_run_time() // options.step_seconds)
        if step >= options.steps:
            return None
        return options.step_users * (step + 1), float(options.step_users)


class SpikeLoadShape(LoadTestShape):
    """``--base-users``, then ``--spike-users`` for ``--spike-seconds``, then the base again, then stop."""

    abstract = SHAPE not in ("spike", "all")

    def tick(self) -> tuple[int, float] | None:
        options = _options(self.runner.environment) if self.runner else None
        if options is None:
            return None
        t = self.get_run_time()
        spike_end = options.spike_after + options.spike_seconds
        if t < options.spike_after:
            return options.base_users, float(options.base_users)
        if t < spike_end:
            # Everyone at once: a spike that ramps is a step.
            return options.spike_users, float(options.spike_users)
        if t < spike_end + options.spike_tail:
            return options.base_users, float(options.spike_users)
        return None
