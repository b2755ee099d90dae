"""Several models in one service: the entries of ``ZHEMBED_MODELS`` (or repeated ``--model NAME=SOURCE``
flags), each turned into the settings that one model runs with.

An entry is ``NAME=SOURCE``, SOURCE as ``--model`` takes it (a hub id, a checkpoint folder, an export),
optionally followed by ``;OPTION=VALUE`` for what differs for that model from the service's settings
(:data:`PER_MODEL`), e.g. ``embed=models/twin;variant=int8,rerank=./reranker;max_concurrent_inputs=64``.
A model's settings are the service's with its source, its name as the served name and its admission
budget: the one it sets, or an even share of what ``max_concurrent_inputs`` leaves after those that set
one, so that a flood on one model never takes another's permits.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import TypeAdapter, ValidationError

if TYPE_CHECKING:
    from app.settings import Settings

# What one model of several may set for itself (NAME=SOURCE;OPTION=VALUE); ``max_concurrent_inputs`` is
# its admission budget.
PER_MODEL = ("variant", "revision", "max_concurrent_inputs", "max_batch_size", "max_batch_tokens")
# What a request's ``model`` names: no ``=``, ``,`` or ``;`` (they separate entries), never a path's start.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
BUDGET = "max_concurrent_inputs"


def entries(settings: Settings) -> tuple[tuple[str | None, Settings], ...]:
    """Each model's name (None for the one model of ``model``) and the settings it runs with.

    Raises:
        ValueError: an entry is not NAME=SOURCE, a name repeats, an option is unknown or out of bounds,
            or the budgets do not each hold one full request and together fit ``max_concurrent_inputs``.
    """
    if settings.models is None:
        return ((None, settings),)
    updates: dict[str, dict[str, Any]] = {}
    for text in (e.strip() for e in settings.models.split(",")):
        name, equals, rest = (part.strip() for part in text.partition("="))
        source, *options = (part.strip() for part in rest.split(";"))
        if not (equals and NAME.match(name) and source) or name in updates:
            raise ValueError(
                f"models: {text!r} is not NAME=SOURCE with a NAME of its own (letters, digits and ._:/-)"
            )
        updates[name] = {"model": source, "served_model_name": name, "models": None}
        for option in options:
            key, _, value = (part.strip() for part in option.partition("="))
            updates[name][key.replace("-", "_")] = _option(settings, name, key.replace("-", "_"), value)
    own = sum(u[BUDGET] for u in updates.values() if BUDGET in u)
    unset = [u for u in updates.values() if BUDGET not in u]
    for update in unset:
        update[BUDGET] = (settings.max_concurrent_inputs - own) // len(unset)
    out = tuple((name, settings.model_copy(update=u)) for name, u in updates.items())
    budgets = {name: s.max_concurrent_inputs for name, s in out}
    if sum(budgets.values()) > settings.max_concurrent_inputs or min(budgets.values()) < (
        settings.max_inputs_per_request
    ):
        listed = ", ".join(f"{n} {b}" for n, b in budgets.items())
        raise ValueError(
            f"models: the admission budgets ({listed}) must each hold max_inputs_per_request "
            f"({settings.max_inputs_per_request}) and together fit max_concurrent_inputs "
            f"({settings.max_concurrent_inputs})"
        )
    return out


def _option(settings: Settings, name: str, key: str, value: str) -> Any:
    """``value`` read as the setting ``key`` reads it, with its bounds.

    Raises:
        ValueError: ``key`` is not one a model may set, or ``value`` is not valid for it.
    """
    if key not in PER_MODEL:
        raise ValueError(f"models: {name} sets {key!r}; a model may set {', '.join(PER_MODEL)}")
    field = type(settings).model_fields[key]
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[field.annotation, field])  # type: ignore[arg-type]
    try:
        return adapter.validate_python(value, strict=False)
    except ValidationError as exc:
        raise ValueError(f"models: {name}'s {key}={value!r}: {exc.errors()[0]['msg']}") from None


def fold_model_flags(args: list[str]) -> list[str]:
    """``args`` with repeated ``--model`` flags, or one ``--model NAME=SOURCE``, as one ``--models``.

    One ``--model SOURCE`` stays as it is: a service of one model, as before.
    """
    found: list[tuple[int, int, str]] = []  # (index, how many args, value)
    for i, arg in enumerate(args):
        if arg.startswith("--model="):
            found.append((i, 1, arg.removeprefix("--model=")))
        elif arg == "--model" and i + 1 < len(args):
            found.append((i, 2, args[i + 1]))
    named = any("=" in value and NAME.match(value.partition("=")[0]) for _, _, value in found)
    if len(found) < 2 and not named:
        return args
    for i, width, _ in reversed(found):
        del args[i : i + width]
    return [*args, "--models", ",".join(value for _, _, value in found)]


def with_sources(settings: Settings, sources: list[str]) -> Settings:
    """``settings`` with each model's source replaced by ``sources`` (in order; its options kept): the
    folders the models were resolved to, for worker processes that must not export them again."""
    if settings.models is None:
        (source,) = sources
        return settings.model_copy(update={"model": source})
    texts = [e.strip() for e in settings.models.split(",")]
    rebuilt = []
    for text, source in zip(texts, sources, strict=True):
        name, _, rest = text.partition("=")
        _, *options = rest.split(";")
        rebuilt.append(";".join([f"{name.strip()}={source}", *options]))
    return settings.model_copy(update={"models": ",".join(rebuilt)})
