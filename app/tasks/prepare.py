"""Preparing a request: its texts checked, their token ids made into the sequences the engine runs, and a
problem kept per input refused: a route raises the first (:meth:`Prepared.refuse`), the bulk job records
each and embeds the rest (docs/models.md, "How a request's options are prepared")."""

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
    """How a route prepares its inputs' token ids."""

    limit: int  # the model's length, [CLS] and [SEP] included
    too_long: str  # what the refusal of a longer input tells the sender to do
    long_text: LongText = "error"
    direction: Direction = "right"
    specials: tuple[int, int] = (0, 0)  # the [CLS] and [SEP] each window of long_text "chunk" has
    # Refuse an input of [CLS] [SEP] alone (the head routes run it instead, as transformers' pipelines do).
    refuse_empty: bool = True
    # The positions at the start truncation keeps: [CLS] and the prompt's tokens (under limit - 1).
    keep: int = 1


@dataclass
class Prepared:
    """A request's inputs as the sequences to run, in input order: each good input's own, its truncation,
    or its windows."""

    ids: list[np.ndarray]
    inputs: np.ndarray  # the request's indices of the good inputs
    lengths: np.ndarray  # every input's tokens before any cut (0 for one refused before it had any)
    types: list[np.ndarray | None] | None = None  # token types, for pairs
    windows: Windows | None = None  # each sequence's good input and text tokens; None: one sequence each
    problems: dict[int, ServiceError] = field(default_factory=dict)
    cuts: dict[int, np.ndarray] = field(default_factory=dict)  # good input → positions kept (truncated texts)

    @property
    def tokens(self) -> np.ndarray:
        """The good inputs' tokens before any cut, in order."""
        return self.lengths[self.inputs]

    def positions(self, k: int) -> np.ndarray:
        """The positions of good input ``k``'s ids that run: all, or its truncation (texts, not pairs)."""
        cut = self.cuts.get(k)
        return cut if cut is not None else np.arange(self.lengths[self.inputs[k]])

    def refuse(self) -> None:
        """Raise the first input's problem, if any, popped and dropped here: its traceback holds this frame,
        so a preparation still holding it would be a cycle, kept until a full collection."""
        if not self.problems:
            return
        problem = self.problems.pop(min(self.problems))
        try:
            raise problem
        finally:
            del problem


def too_long(name: str, tokens: int, limit: int, remedy: str) -> ValidationFailed:
    return ValidationFailed(f"{name} has {tokens} tokens, over the model's limit of {limit}; {remedy}")


def check_some(count: int, field: str, one: str = "input") -> None:
    if not count:
        raise EmptyInput(f"{field} is empty: send at least one {one}")


def check_count(count: int, max_inputs: int, names: Names) -> None:
    check_some(count, names.field)
    if count > max_inputs:
        raise ValidationFailed(
            f"{count} inputs in one request; the limit is {max_inputs} "
            "(ZHEMBED_MAX_INPUTS_PER_REQUEST): send them in several requests"
        )


def text_problem(text: str, max_chars: int, name: Name, i: int) -> ServiceError | None:
    """Why text ``i`` cannot be tokenised (over ``max_chars``, empty, only whitespace); None if it can."""
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
    return {i: p for i, text in enumerate(texts) if (p := text_problem(text, max_chars, name, i)) is not None}


def texts_of(
    inputs: str | list[str], max_inputs: int, max_chars: int, names: Names | None = None
) -> list[str]:
    """The request's inputs as a list, checked against the per-request limits; raises the first problem."""
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
    """:func:`prepare` on tokenised inputs; ``pairs`` says which are pairs (their token types go along)."""
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    types = None
    if pairs is not None and any(pairs):
        types = [
            np.asarray(e.type_ids, dtype=np.int64) if pair else None
            for e, pair in zip(encodings, pairs, strict=True)
        ]
    return prepare(ids, rules, name, types)


@dataclass(frozen=True)
class GivenIds:
    """Token-id inputs, checked, each run as given; ``keys`` write each out for the vector cache."""

    ids: list[np.ndarray]
    keys: list[str]


def given_ids(
    sequences: list[list[int]], rules: Rules, names: Names, max_inputs: int, vocab_size: int
) -> tuple[GivenIds, dict[int, ServiceError]]:
    """The good token-id inputs, and why each other is refused, by index."""
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
    """The sequences each input's ids ([CLS] … [SEP]; ``types``: a pair's token types, None for a text) run
    as, and a problem for each input refused; ``name(i)`` names input ``i`` in a problem."""
    count = len(ids)
    sizes = [len(x) for x in ids]
    # The common case, in plain Python (a request of a few inputs pays per call for numpy's checks):
    # one sequence per input, no problem, no loop below.
    if sizes and min(sizes) > (2 if rules.refuse_empty else -1) and max(sizes) <= rules.limit:
        return Prepared(ids, np.arange(count), np.array(sizes, np.int64), types)
    lengths = np.array(sizes, np.int64)
    problems: dict[int, ServiceError] = {}
    if rules.refuse_empty:  # only control or zero-width characters: refused as "" and whitespace are
        for i in np.flatnonzero(lengths <= 2).tolist():
            problems[i] = EmptyInput(
                f"{name(i)} has no tokens: its characters are all ones the tokenizer drops"
            )
    if rules.long_text == "error":
        for i in np.flatnonzero(lengths > rules.limit).tolist():
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
        x, kind = ids[i], types[i] if types is not None else None
        if kind is not None:  # a pair: truncated as Hugging Face does, never cut into windows
            row, kind = truncate_pair(x, kind, rules.limit, rules.direction)
            cut = [row]
        elif len(x) > rules.limit and rules.long_text == "truncate":
            cuts[k] = truncated_positions(len(x), rules.limit, rules.direction, rules.keep)
            cut = [x[cuts[k]]]
        else:
            cut = windows(x, rules.limit, rules.long_text, rules.direction, *rules.specials)
        sequences.extend(cut)
        kinds.extend([kind] * len(cut))
        owners.extend([k] * len(cut))
    window_tokens = np.array([max(len(w) - 2, 1) for w in sequences], dtype=np.int64)
    return Prepared(
        sequences,
        good,
        lengths,
        kinds if types is not None else None,
        (np.array(owners, dtype=np.int64), window_tokens),
        problems,
        cuts,
    )
