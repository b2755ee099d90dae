"""The service's typed errors. The engine and the service raise these and know nothing of HTTP; the API
layer (:mod:`app.api.errors`) holds the one table that turns each type into a status and a JSON body."""

from __future__ import annotations

from typing import Any

# What a JSON value was, in JSON's words: how the API's field errors, and the bulk job's row errors,
# name what was sent ("inputs[3] must be a string, not a number").
JSON_KINDS: dict[type, str] = {
    type(None): "null",
    list: "an array",
    dict: "an object",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def json_kind(value: Any) -> str:
    """``value``'s kind in JSON's words (:data:`JSON_KINDS`)."""
    return JSON_KINDS.get(type(value), "something else")


class ServiceError(Exception):
    """Base of every error the service answers with; the subclass picks the row of the table."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EmptyInput(ServiceError):
    """No input, or an empty string as an input."""


class PayloadTooLarge(ServiceError):
    """The request body is larger than ``max_body_bytes``."""


class MalformedBody(ServiceError):
    """The body cannot be read at all: not JSON (or not sent as JSON), not UTF-8, nested past the parser,
    or, over gRPC, a message that is not valid protobuf."""


class ValidationFailed(ServiceError):
    """The request is well-formed JSON but asks for something out of bounds or of the wrong type."""


class Unsupported(ServiceError):
    """The loaded model cannot do what was asked (e.g. fill-mask without a masked-LM head)."""


class Unauthorized(ServiceError):
    """API keys are on and the request carries no valid ``Authorization: Bearer`` key."""


class NotFound(ServiceError):
    """No such route."""


class UnknownModel(NotFound):
    """The request names a model this service does not serve (the message lists those it does)."""


class MethodNotAllowed(ServiceError):
    """The route exists but not for this method."""


class Overloaded(ServiceError):
    """No admission permits left; retry later."""


class NotReady(ServiceError):
    """The model is still loading or warming up."""


class ClientGone(ServiceError):
    """The client disconnected before the answer was ready; nobody reads the response."""


class InternalError(ServiceError):
    """A server fault (a broken invariant); never caused by an input. Logged with its traceback."""
