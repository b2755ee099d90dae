"""The job's flags that are not its own: every ``EmbedOptions`` field, and the service's settings that
decide how the engine runs. Both are read off their declarations, so there is no second vocabulary.

- An ``EmbedOptions`` field ``long_text`` is the flag ``--long-text``; its values are the field's type
  (a ``Literal``'s values are the choices, a bool is ``--x`` / ``--no-x``, a tuple takes one or more
  values: ``--layers -1 -2``). A flag left out is the model's default (:func:`app.tasks.options.model_defaults`),
  as for a request that leaves the option out. A field added to ``EmbedOptions`` gets its flag here with
  no change (a test holds every field to a flag).
- A setting ``max_batch_size`` is ``--max-batch-size``, its help the field's description in
  :mod:`app.settings`; unset flags fall back to ``ZHEMBED_*`` variables and the defaults, as for the
  service, and pydantic checks the values. Only :class:`Settings` reads the variables: the job asks it
  which fields were set (by flag or variable) and reads none itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import ValidationError

from app.engine import pooling
from app.settings import Settings
from app.tasks.options import EmbedOptions

# One line each, in the job's terms; a field missing here gets a plain one (and works all the same).
OPTION_HELP = {
    "pooling": "how a text's token states become one vector. " + pooling.describe(),
    "layers": "layers to read, 1..L or -L..-1 from the end (e.g. --layers -1 -2); default the last",
    "layer_combine": "how several layers combine: concat (side by side), mean, weighted (by "
    "--layer-weights) or difference (two layers: the first minus the second); default concat",
    "layer_weights": "with --layer-combine weighted: one weight >= 0 per layer, scaled to sum 1",
    "long_text": "texts over the model's length: error (a bad row), truncate, or chunk (windows of the "
    "model's length, averaged weighted by tokens); default the model's",
    "truncation_direction": "which end truncation keeps: right keeps the start; default right",
    "normalize": "scale each vector to unit length; default the model's",
    "prompt_name": "one of the model's prompts, put before each text; default the model's default prompt",
    "dimensions": "keep each vector's first N components (then normalised again), on a model trained for "
    "shorter vectors (Matryoshka); default the whole vector",
}

# The service's settings a bulk job's engine reads (the rest are the server's: ports, workers, keys).
SETTING_FLAGS = (
    "revision",
    "cache_dir",
    "variant",
    "providers",
    "intra_op_threads",
    "max_batch_tokens",
    "max_batch_size",
    "batch_overhead_tokens",
    "max_queue_delay_ms",
    "max_input_chars",
)
# The queue-delay budget of a job that sets none (flag or ZHEMBED_MAX_QUEUE_DELAY_MS). The service derives
# half a batch's time, so that an interactive request is never passed over for long; a job has nobody
# waiting on one text, and its window of queued texts (4096: minutes of work on a CPU) would put every
# text past that budget, so each batch would be pinned to the oldest text instead of cut for the most
# work per second (measured on the int8 twin, 2 cores: 0.94 x the raw ceiling with the derived budget,
# 1.01 x with this one). Ten minutes still bounds how long any one text can be passed over.
BULK_QUEUE_DELAY_MS = 600_000.0


class UsageError(ValueError):
    """A flag's value that cannot be used: one line, exit status 2."""


def _plain(kind: Any) -> Any:
    """``X | None`` → ``X``."""
    if get_origin(kind) in (Union, types.UnionType):
        rest = [a for a in get_args(kind) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind


def option_arguments() -> list[tuple[str, dict[str, Any]]]:
    """(flag, ``add_argument`` keywords) for every ``EmbedOptions`` field.

    Raises:
        TypeError: a field of a type no flag is made for (a new kind of option needs a rule here).
    """
    hints = get_type_hints(EmbedOptions)
    out = []
    for f in dataclasses.fields(EmbedOptions):
        kind = _plain(hints[f.name])
        spec: dict[str, Any] = {"dest": f"option_{f.name}", "default": None}
        spec["help"] = OPTION_HELP.get(f.name, f"the /embed option {f.name}; default the model's")
        if get_origin(kind) is Literal:
            spec["choices"] = list(get_args(kind))
        elif kind is bool:
            spec["action"] = argparse.BooleanOptionalAction
        elif (
            get_origin(kind) is tuple
            and get_args(kind)[1:] == (Ellipsis,)
            and get_args(kind)[0] in (int, float)
        ):
            spec.update(nargs="+", type=get_args(kind)[0], metavar=get_args(kind)[0].__name__.upper())
        elif kind in (int, float, str):
            spec["type"] = kind
        else:
            raise TypeError(f"EmbedOptions.{f.name} is of type {kind}, which has no flag rule")
        out.append(("--" + f.name.replace("_", "-"), spec))
    return out


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EmbedOptions`` fields the command line gave (lists as tuples), for ``replace(defaults, ...)``."""
    given = {}
    for f in dataclasses.fields(EmbedOptions):
        value = getattr(args, f"option_{f.name}")
        if value is not None:
            given[f.name] = tuple(value) if isinstance(value, list) else value
    return given


def setting_arguments() -> list[tuple[str, dict[str, Any]]]:
    """(flag, ``add_argument`` keywords) for each of :data:`SETTING_FLAGS`, help from :mod:`app.settings`."""
    out = []
    for name in SETTING_FLAGS:
        info = Settings.model_fields[name]
        spec: dict[str, Any] = {"dest": f"setting_{name}", "default": None, "help": info.description}
        kind = _plain(info.annotation)
        if get_origin(kind) is Literal:
            spec["choices"] = list(get_args(kind))
        else:
            spec["metavar"] = "N" if kind in (int, float) else name.split("_")[-1].upper()
        out.append(("--" + name.replace("_", "-"), spec))
    return out


def settings_of(args: argparse.Namespace, model: str | None) -> Settings:
    """The service's settings from the flags given, ``ZHEMBED_*`` variables and the defaults.

    Raises:
        UsageError: a value the settings refuse (one line naming the flag).
    """
    given: dict[str, Any] = {
        name: v for name in SETTING_FLAGS if (v := getattr(args, f"setting_{name}")) is not None
    }
    if model is not None:
        given["model"] = model
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = first["loc"][0] if first["loc"] else ""
        flag = f"--{str(where).replace('_', '-')}" if where else "settings"
        raise UsageError(f"{flag}: {first['msg']}") from None
    if "max_queue_delay_ms" not in settings.model_fields_set:  # neither the flag nor the variable
        settings = settings.model_copy(update={"max_queue_delay_ms": BULK_QUEUE_DELAY_MS})
    return settings
