"""/fill-mask: inputs with [MASK], top_k and targets (also in Hugging Face's ``parameters`` form)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from app.api.schemas.common import Inputs, Named, StrictRequest, Text, text_or_list

# The answer holds at most top_k (≤ 50) targets, but the candidate set may be larger: rank a class of a
# couple of hundred words and read the best 50. Each target costs a vocabulary look-up on the event loop
# (~0.5 µs) and, if it is not a token, one more text on the tokenisation thread: 256 keep that near 0.1 ms.
MAX_TARGETS = 256


class FillMaskParameters(StrictRequest):
    """The options in the Hugging Face Inference API's form, as huggingface_hub's InferenceClient sends them."""

    top_k: int | None = Field(
        default=None, ge=1, le=50, description="Predictions per [MASK], 1..50: the top-level top_k."
    )
    targets: (
        Annotated[
            Annotated[Text, Tag("text")]
            | Annotated[list[Text], Field(min_length=1, max_length=MAX_TARGETS), Tag("list")],
            Discriminator(
                text_or_list,
                custom_error_type="targets_type",
                custom_error_message="must be a string or a list of strings",
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Only these tokens compete, scored by their probability over the whole vocabulary, "
        f"as the pipeline's targets (at most {MAX_TARGETS}): a target that is not a vocabulary token "
        "stands for its first token, one with no token is ignored; top_k is capped at their number.",
    )


class FillMaskRequest(Named):
    inputs: Inputs
    top_k: int = Field(
        default=5, ge=1, le=50, description="Predictions per [MASK], 1..50 (or parameters.top_k)."
    )
    parameters: FillMaskParameters | None = Field(
        default=None, description="Hugging Face's form of the options: {top_k, targets}."
    )

    @model_validator(mode="after")
    def _top_k_once(self) -> Self:
        given = self.parameters.top_k if self.parameters is not None else None
        if given is not None and "top_k" in self.model_fields_set and given != self.top_k:
            raise ValueError(
                f"top_k is {self.top_k} but parameters.top_k is {given}: give top_k once, in either place"
            )
        return self

    def wanted_top_k(self) -> int:
        """``parameters.top_k`` if given, else the top-level ``top_k`` (default 5)."""
        given = self.parameters.top_k if self.parameters is not None else None
        return given if given is not None else self.top_k

    def target_list(self) -> list[str] | None:
        """``parameters.targets`` as a list; None when not given."""
        targets = self.parameters.targets if self.parameters is not None else None
        return [targets] if isinstance(targets, str) else targets


class Prediction(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


# One input's answer, as the pipeline gives it: the candidates for its one [MASK], or for several masks
# one list of candidates per mask.
FillMaskAnswer = list[Prediction] | list[list[Prediction]]
# A string's answer alone; a list of inputs (even of one) gets one answer per input.
FillMaskResponse = FillMaskAnswer | list[FillMaskAnswer]
