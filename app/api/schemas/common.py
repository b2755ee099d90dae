"""What every request shape is made of: texts that must be valid Unicode, a text or a list of them,
strict types, TEI's truncation fields, a token's description."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from app.tasks.options import Direction, LongText


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); no tokenizer can take them, so refuse them here.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "text_unicode",
            "is not valid Unicode: {reason} at character {at} (a lone UTF-16 surrogate has no UTF-8 form)",
            {"reason": exc.reason, "at": exc.start},
        ) from None
    return text


# The document says a text holds a character that is not whitespace (what the service accepts), while
# validation leaves an empty one to the service: its answer is the documented 400 `empty`, as TEI's.
Text = Annotated[str, AfterValidator(_utf8), Field(json_schema_extra={"minLength": 1, "pattern": r"\S"})]


def text_or_list(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None


# A callable discriminator picks the one form that fits the JSON value, so an error speaks of that form
# only ("inputs[3] must be a string"), never of every alternative as a plain union's errors would.
Inputs = Annotated[
    Annotated[Text, Tag("text")] | Annotated[list[Text], Tag("list")],
    Discriminator(
        text_or_list,
        custom_error_type="inputs_type",
        custom_error_message="must be a string or a list of strings",
    ),
]
# The union tags above (and below), which are no field names: error locations leave them out.
UNION_TAGS = frozenset({"text", "list", "ids", "id_lists", "texts", "similarity", "document"})


class StrictRequest(BaseModel):
    # Strict: "1" is not a number and 1 is not a string. Unknown fields are ignored, as TEI does.
    model_config = ConfigDict(strict=True, extra="ignore")


class Named(StrictRequest):
    """A data route's request, which may name the model that answers it."""

    model: str | None = Field(
        default=None,
        max_length=256,
        description="The model that answers, by its served name (GET /v1/models lists them). Default: the "
        "route's (the only model that serves it, else the first that does). A service of one model "
        "(ZHEMBED_MODEL) answers with it whatever this says; of several, an unknown name is a 404.",
    )


class Truncation(StrictRequest):
    """TEI's ``truncate`` and ``truncation_direction``: declared here once, for every route that takes them."""

    truncate: bool = Field(default=False, description="TEI: truncate inputs over the model's length.")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right",
        description="Which end truncation keeps: right keeps the start, left the end (a prompt, on the "
        "routes that take one, is kept either way: [CLS] prompt … tail [SEP]).",
    )

    def truncation(self, default: LongText = "error") -> LongText:
        """What ``truncate`` asks for when sent (true truncates, false refuses); ``default`` when not."""
        if "truncate" in self.model_fields_set:
            return "truncate" if self.truncate else "error"
        return default

    def direction(self) -> Direction:
        return "left" if self.truncation_direction.lower() == "left" else "right"


class TruncateFields(Truncation):
    """The routes that take no ``long_text``: ``truncate`` alone decides."""

    def long_text(self) -> LongText:
        return self.truncation()


class Token(BaseModel):
    id: int
    text: str
    special: bool
    # Code points, as Python indexes a str: an emoji counts 1 (JavaScript's String counts it 2).
    start: int = Field(description="Character (code point) offset where the token starts in the input.")
    stop: int = Field(description="Character (code point) offset just past the token's end.")


# A list, not a tuple: strict mode would refuse the JSON array a tuple is sent as.
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]
