"""/tokenize: inputs and the tokens answered."""

from __future__ import annotations

from app.api.schemas.common import Inputs, Named, Token


class TokenizeRequest(Named):
    inputs: Inputs
    add_special_tokens: bool = True


TokenizeResponse = list[list[Token]]
