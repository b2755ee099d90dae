"""Hypothesis strategies for any protobuf request message, built from its descriptor: every field of every
type, set or left unset, with values from the whole range of its type (out-of-range numbers, any Unicode,
NaN) and, more often, the values the service means (texts with ``[MASK]``, the option names it knows, a
model's widths, token ids of its vocabulary), so that most messages reach the model and some reach a limit.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

# Any Unicode but lone surrogates (protobuf cannot serialise them, so no client can send one).
ANY_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=64)
MEANT_TEXT = st.sampled_from(
    ["今天天气很好", "北京是中国的[MASK]都。", "[MASK]", "上海[MASK][MASK]", "你好 world"]
)
# Over the tiny models' 128 tokens, and over the live server's 1024 characters.
LONG_TEXT = st.sampled_from(["长城" * 200, "长" * 1025])
VOCABULARY = 21128  # the tiny models' (bert-base-chinese's)

# By field name: the values that field means, beside its type's whole range.
MEANT: dict[str, st.SearchStrategy[Any]] = {
    "dimensions": st.just(64),  # the tiny models' width (they name no shorter ones)
    "top_k": st.integers(1, 50),
    "ids": st.integers(0, VOCABULARY - 1),
    "layers": st.sampled_from([-3, -2, -1, 1, 2, 3]),
    "layer_weights": st.floats(0, 2),
    "index": st.integers(0, 16),
}
# zhembed.proto's EmbedOptions, which name their choices in words.
OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "pooling": st.sampled_from(
        ["cls", "mean", "pooler", "max", "mean_sqrt_len", "weightedmean", "lasttoken"]
    ),
    "layer_combine": st.sampled_from(["concat", "mean", "weighted", "difference"]),
    "long_text": st.sampled_from(["error", "truncate", "chunk"]),
    "truncation_direction": st.sampled_from(["right", "left"]),
}

# Fields mostly left unset: any value but the few a model defines is refused (the tiny models define no
# prompts; a fill-mask target must be one token of the vocabulary; layer weights go with one combination
# only), so set they would keep most messages from the model.
MOSTLY_UNSET = {"prompt_name", "targets", "layer_weights"}
# Repeated fields of a fixed length: mostly that length.
LENGTHS = {"tei.v1.PredictPairRequest.inputs": 2}

INTEGERS: dict[int, st.SearchStrategy[int]] = {
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
}


def scalar(field: FieldDescriptor, meant_only: bool) -> st.SearchStrategy[Any]:
    """One value of a field that is not a message: one it means (if it has any), or three times in four
    one it means and else any of its type's."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        anything: st.SearchStrategy[Any] = st.one_of(ANY_TEXT, LONG_TEXT)
        in_options = field.containing_type.full_name == "zhembed.v1.EmbedOptions"
        meant: st.SearchStrategy[Any] = OPTIONS.get(field.name, MEANT_TEXT) if in_options else MEANT_TEXT
    elif kind == FieldDescriptor.TYPE_ENUM:
        # proto3 enums are open: a number the enum does not name arrives as itself.
        anything, meant = st.integers(0, 99), st.sampled_from([v.number for v in field.enum_type.values])
    elif kind in INTEGERS:
        anything, meant = INTEGERS[kind], st.integers(0, 8)
    elif kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    elif kind == FieldDescriptor.TYPE_FLOAT:
        anything, meant = st.floats(width=32), st.floats(-2, 2, width=32)  # NaN and the infinities
    elif kind == FieldDescriptor.TYPE_DOUBLE:
        anything, meant = st.floats(), st.floats(-2, 2)
    elif kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    else:
        raise NotImplementedError(f"no strategy for {field.full_name}'s type {kind}")
    meant = MEANT.get(field.name, meant)
    return meant if meant_only else st.one_of(meant, meant, meant, anything)


def message(pb: ModuleType, descriptor: Descriptor) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type (its class from the generated module ``pb``): half of them of
    meant values only (most of which the model answers), half of any."""
    return st.one_of(fields_of(pb, descriptor, True), fields_of(pb, descriptor, False))


def presence(
    field: FieldDescriptor, value: st.SearchStrategy[Any], meant_only: bool
) -> st.SearchStrategy[Any]:
    """A field's values or its absence (None or an empty list: left unset)."""
    unset: st.SearchStrategy[Any] = st.just([]) if field.is_repeated else st.none()
    if field.name in MOSTLY_UNSET:
        return st.one_of(unset, unset, unset, st.lists(value, max_size=4) if field.is_repeated else value)
    if not field.is_repeated:
        return st.one_of(value, value, unset)
    length = LENGTHS.get(field.full_name)
    few = st.lists(value, min_size=length or 1, max_size=length or 4)
    # Mostly one to four, else none or past the per-request limit (16 on the live server).
    return st.one_of(few, few, unset if meant_only else st.lists(value, max_size=20))


def fields_of(
    pb: ModuleType, descriptor: Descriptor, meant_only: bool, depth: int = 0
) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type, each field a meant value (``meant_only``) or any."""
    cls = getattr(pb, descriptor.name)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            value = fields_of(pb, field.message_type, meant_only, depth + 1) if depth < 2 else st.nothing()
        else:
            value = scalar(field, meant_only)
        fields[field.name] = presence(field, value, meant_only)
    return st.fixed_dictionaries(fields).map(
        lambda chosen: cls(**{k: v for k, v in chosen.items() if v is not None and v != []})
    )
