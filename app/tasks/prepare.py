"""Preparing a request: its inputs in, the sequences the engine runs out, and a problem per input it refuses.

Every route and the bulk job prepare their inputs here, in one order:

1. the texts as sent (:func:`texts_of` for a request, :func:`text_problems` per text): none empty, only
   whitespace, or over ``max_input_chars``;
2. their token ids, from the tokenizer's encodings (:func:`from_encodings`) or given by the sender
   (:func:`given_ids`, checked against the vocabulary);
3. each input's length (:func:`prepare`): one with no tokens is refused where the route refuses it, one
   over the model's length is refused (``long_text`` "error"), truncated, or cut into windows
   (:mod:`app.tasks.windows`); a pair is cut as Hugging Face cuts it.

A problem is an input's own :class:`~app.errors.ServiceError` (its message names it as the request did),
kept per input rather than raised at the first: a route raises the first (:meth:`Prepared.refuse`,
the message it has always had), the bulk job records every one and embeds the rest, in one pass.
Checks run on whole arrays of lengths; a message is written only for an input that has a problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Encoding as TokenEncoding

from app.errors import EmptyInput, ServiceError, ValidationFailed
from app.tasks.layers import Windows
from app.tasks.options import Direction, LongText, Names, listed
from app.tasks.token_ids import out_of_vocabulary
from app.tasks.windows import truncate_pair, truncated_positions, windows

# What to do about an input over the model's length, by route.
TOO_LONG_EMBED = "send long_text 'truncate' or 'chunk' (or truncate: true) to embed it anyway"
TOO_LONG_TOKENS = "send long_text 'truncate' (or truncate: true) for its start; /embed_all cannot chunk"
TOO_LONG_OPENAI = (
    "this route does not truncate: shorten it, or use POST /embed with long_text 'truncate' or 'chunk'"
)
TOO_LONG_MASKS = "fill-mask cannot truncate: shorten the text around the masks"
# The routes that take TEI's truncate and no long_text (the heads, sparse vectors): one refusal.
TOO_LONG_TRUNCATE = "send truncate: true to keep its start (truncation_direction left keeps its end)"

# Names input ``i`` as the request wrote it (``inputs[2]``); called only to word a problem.
Name = Callable[[int], str]


@dataclass(frozen=True)
class Rules:
    """How a route prepares its inputs' token ids.

    ``limit``: the model's length, [CLS] and [SEP] included; ``too_long``: what the refusal of a longer
    input tells the sender to do; ``long_text`` and ``direction``: what happens to it instead;
    ``specials``: the [CLS] and [SEP] ids each window of ``long_text`` "chunk" starts and ends with;
    ``refuse_empty``: an input the tokenizer leaves nothing of ([CLS] [SEP] only) is refused (the head
    routes run it, as transformers' pipelines do, and fill-mask refuses it for having no [MASK]).
    ``keep``: the positions at the start that truncation keeps, [CLS] and the prompt's tokens after it
    (the prompt stays when ``direction`` "left" cuts the text's start); under ``limit - 1``.
    """

    limit: int
    too_long: str
    long_text: LongText = "error"
    direction: Direction = "right"
    specials: tuple[int, int] = (0, 0)
    refuse_empty: bool = True
    keep: int = 1


@dataclass
class Prepared:
    """A request's inputs as the sequences to run.

    ``ids`` (and ``types``, for pairs) are the sequences, in input order: each good input's own, its
    truncation, or its windows. ``inputs`` are the request's indices of the good inputs; ``owners``
    (None: one sequence per good input) which of them each sequence belongs to, and ``window_tokens``
    how many of its tokens are the text's. ``lengths`` are every input's tokens before any cut, [CLS]
    and [SEP] included (0 for one refused before it had any); ``problems`` why each bad input is refused.
    """

    ids: list[np.ndarray]
    inputs: np.ndarray
    lengths: np.ndarray
    types: list[np.ndarray | None] | None = None
    owners: np.ndarray | None = None
    window_tokens: np.ndarray | None = None
    problems: dict[int, ServiceError] = field(default_factory=dict)
    cuts: dict[int, np.ndarray] = field(default_factory=dict)  # good input → positions kept (truncated texts)

    @property
    def windows(self) -> Windows | None:
        """Which good input each sequence belongs to and the tokens it carries (None: one each)."""
        if self.owners is None or self.window_tokens is None:
            return None
        return self.owners, self.window_tokens

    @property
    def tokens(self) -> np.ndarray:
        """The good inputs' tokens before any cut, in order."""
        return self.lengths[self.inputs]

    def positions(self, k: int) -> np.ndarray:
        """The positions of good input ``k``'s ids that run: all, or its truncation (texts, not pairs)."""
        cut = self.cuts.get(k)
        return cut if cut is not None else np.arange(self.lengths[self.inputs[k]])

    def refuse(self) -> None:
        """Raise the first input's problem, if any input has one: how a request is refused.

        The problem leaves ``problems`` as it is raised, and this frame lets go of it: its traceback holds
        this frame, which holds the preparation, and the frames of the plan and the job above it; a
        preparation still holding it would be a cycle, kept (with the job) until a full collection.

        Raises:
            EmptyInput, ValidationFailed: the first bad input's, in input order.
        """
        if not self.problems:
            return
        problem = self.problems.pop(min(self.problems))
        try:
            raise problem
        finally:
            del problem


def too_long(name: str, tokens: int, limit: int, remedy: str) -> ValidationFailed:
    """The refusal of the input called ``name`` of ``tokens`` tokens, over the model's ``limit``, saying
    what to do (``remedy``)."""
    return ValidationFailed(f"{name} has {tokens} tokens, over the model's limit of {limit}; {remedy}")


def no_tokens(name: str) -> EmptyInput:
    """The refusal of an input the tokenizer leaves nothing of (only control or zero-width characters):
    the same as for "" and whitespace."""
    return EmptyInput(f"{name} has no tokens: its characters are all ones the tokenizer drops")


def check_some(count: int, field: str, one: str = "input") -> None:
    """A request's list ``field`` holds ``count`` items: EmptyInput when none, asking for at least ``one``."""
    if not count:
        raise EmptyInput(f"{field} is empty: send at least one {one}")


def check_count(count: int, max_inputs: int, names: Names) -> None:
    """A request's number of inputs (texts or token-id lists): at least one, at most ``max_inputs``.

    Raises:
        EmptyInput: none.
        ValidationFailed: more than ``max_inputs``.
    """
    check_some(count, names.field)
    if count > max_inputs:
        raise ValidationFailed(
            f"{count} inputs in one request; the limit is {max_inputs} "
            "(ZHEMBED_MAX_INPUTS_PER_REQUEST): send them in several requests"
        )


def text_problem(text: str, max_chars: int, name: Name, i: int) -> ServiceError | None:
    """Why text ``i`` (called ``name(i)``) cannot be tokenised: over ``max_chars`` characters, empty, or
    only whitespace; None if it can."""
    if len(text) > max_chars:
        return ValidationFailed(
            f"{name(i)} has {len(text)} characters; the limit is {max_chars} per input "
            "(ZHEMBED_MAX_INPUT_CHARS), checked before tokenising, so truncation does not lift it: "
            f"split the text into parts of at most {max_chars} characters, or raise the server's "
            "ZHEMBED_MAX_INPUT_CHARS"
        )
    if not text:
        return EmptyInput(f"{name(i)} is empty")
    if text.isspace():  # like "": nothing a tokenizer keeps (TEI refuses both alike)
        return EmptyInput(f"{name(i)} is only whitespace: it has no tokens")
    return None


def text_problems(texts: list[str], max_chars: int, name: Name) -> dict[int, ServiceError]:
    """The problem of each text that cannot be tokenised (:func:`text_problem`), by index."""
    return {i: p for i, text in enumerate(texts) if (p := text_problem(text, max_chars, name, i)) is not None}


def texts_of(
    inputs: str | list[str], max_inputs: int, max_chars: int, names: Names | None = None
) -> list[str]:
    """The request's inputs as a list, checked against the per-request limits.

    Raises:
        EmptyInput: no inputs, or one that is empty or only whitespace.
        ValidationFailed: more than ``max_inputs`` inputs, or one over ``max_chars`` characters.
    """
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    names = names or listed("inputs", inputs)
    check_count(len(texts), max_inputs, names)
    for i, text in enumerate(texts):
        if (problem := text_problem(text, max_chars, names.item, i)) is not None:
            raise problem
    return texts


def from_encodings(
    encodings: list[TokenEncoding], rules: Rules, name: Name, pairs: list[bool] | None = None
) -> Prepared:
    """The sequences of tokenised inputs, by :func:`prepare`; ``pairs`` says which inputs are pairs
    (their token types go with them)."""
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    if pairs is None or not any(pairs):
        return prepare(ids, rules, name)
    types = [
        np.asarray(e.type_ids, dtype=np.int64) if pair else None
        for e, pair in zip(encodings, pairs, strict=True)
    ]
    return prepare(ids, rules, name, types)


@dataclass(frozen=True)
class GivenIds:
    """Token-id inputs (OpenAI's API and TEI accept them), checked: each run as given, [CLS] and [SEP]
    the sender's to include. ``keys`` write each out for the vector cache (its own key space)."""

    ids: list[np.ndarray]
    keys: list[str]


def given_ids(
    sequences: list[list[int]], rules: Rules, names: Names, max_inputs: int, vocab_size: int
) -> tuple[GivenIds, dict[int, ServiceError]]:
    """Token-id inputs checked: the good ones, and why each other is refused (empty, over
    ``rules.limit``, an id outside 0..``vocab_size`` - 1), by index.

    Raises:
        EmptyInput: no sequences.
        ValidationFailed: more than ``max_inputs``.
    """
    check_count(len(sequences), max_inputs, names)
    ids: list[np.ndarray] = []
    keys: list[str] = []
    problems: dict[int, ServiceError] = {}
    for i, seq in enumerate(sequences):
        if not seq:
            problems[i] = EmptyInput(f"{names.item(i)} is empty")
        elif len(seq) > rules.limit:
            problems[i] = too_long(names.item(i), len(seq), rules.limit, rules.too_long)
        elif (problem := out_of_vocabulary(seq, vocab_size, names.item, i)) is not None:
            problems[i] = problem
        else:
            ids.append(np.asarray(seq, dtype=np.int64))
            keys.append(",".join(map(str, seq)))
    return GivenIds(ids, keys), problems


def prepare(
    ids: list[np.ndarray], rules: Rules, name: Name, types: list[np.ndarray | None] | None = None
) -> Prepared:
    """The sequences each input (its token ids, [CLS] … [SEP], and token types for pairs) runs as:
    itself, its truncation, or its windows; and a problem for each input refused (no tokens, with
    ``rules.refuse_empty``; over ``rules.limit`` with ``long_text`` "error"). ``name(i)`` names input
    ``i`` in a problem's message; ``types`` hold each pair's token types (None for a text)."""
    count = len(ids)
    sizes = [len(x) for x in ids]
    # The common case, in plain Python (a request of a few inputs pays per call for numpy's checks):
    # one sequence per input, no problem, no loop below.
    if sizes and min(sizes) > (2 if rules.refuse_empty else -1) and max(sizes) <= rules.limit:
        return Prepared(ids, np.arange(count), np.array(sizes, np.int64), types)
    lengths = np.array(sizes, np.int64)
    empty = np.flatnonzero(lengths <= 2) if rules.refuse_empty else np.empty(0, np.int64)
    long = np.flatnonzero(lengths > rules.limit)
    problems: dict[int, ServiceError] = {int(i): no_tokens(name(int(i))) for i in empty}
    if rules.long_text == "error":
        for i in long.tolist():
            problems.setdefault(i, too_long(name(i), int(lengths[i]), rules.limit, rules.too_long))
    good = np.array([i for i in range(count) if i not in problems], dtype=np.int64)
    if not any(lengths[good] > rules.limit):  # refused, but no input cut
        return Prepared(
            [ids[i] for i in good],
            good,
            lengths,
            [types[i] for i in good] if types is not None else None,
            problems=problems,
        )
    sequences: list[np.ndarray] = []
    kinds: list[np.ndarray | None] = []
    owners: list[int] = []
    cuts: dict[int, np.ndarray] = {}
    for k, i in enumerate(good.tolist()):
        x = ids[i]
        kind = types[i] if types is not None else None
        if kind is not None:  # a pair: truncated as Hugging Face does, never cut into windows
            row, kind = truncate_pair(x, kind, rules.limit, rules.direction)
            sequences.append(row)
            kinds.append(kind)
            owners.append(k)
            continue
        if len(x) > rules.limit and rules.long_text == "truncate":
            cuts[k] = truncated_positions(len(x), rules.limit, rules.direction, rules.keep)
            cut = [x[cuts[k]]]
        else:
            cut = windows(x, rules.limit, rules.long_text, rules.direction, *rules.specials)
        sequences.extend(cut)
        kinds.extend([None] * len(cut))
        owners.extend([k] * len(cut))
    window_tokens = np.array([max(len(w) - 2, 1) for w in sequences], dtype=np.int64)
    return Prepared(
        sequences,
        good,
        lengths,
        kinds if types is not None else None,
        np.array(owners, dtype=np.int64),
        window_tokens,
        problems,
        cuts,
    )
