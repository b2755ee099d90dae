"""The service's typed errors. The engine and the service raise these and know nothing of HTTP; the API
layer (:mod:`app.api.errors`) holds the one table that turns each type into a status and a JSON body."""

from __future__ import annotations

import logging
import uuid
from typing import Any

log = logging.getLogger(__name__)

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
    """A server fault (a broken invariant, a failed run); never caused by an input.

    Its ``message`` is the server's insides (an exception's text, node names, shapes, paths): it goes to
    the log, never to the client, who is told :data:`FAULT_MESSAGE` and ``error_id``, the id the log
    record carries too (:mod:`app.api.errors`). One error may answer several requests (the jobs of one
    failed batch): they share its id, and it is logged once (``logged``).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error_id = uuid.uuid4().hex
        self.logged = False  # set by whoever logs it first: the fault's own site, or the answer


class Unavailable(ServiceError):
    """This process cannot serve any more (its warm-up failed or its inference thread died); it is being
    replaced, and a retry lands on another process."""


# What a client is told of a server fault, with its error id; the whole text is in the log under that id.
FAULT_MESSAGE = "internal error: the server failed on this request; its log holds the fault under error id"


def log_fault(error: InternalError, cause: BaseException | None = None) -> InternalError:
    """Log ``error`` (once) with its id and its whole text, and ``cause``'s traceback where there is one;
    returns it. The JSON log gives the id a field of its own (``error_id``)."""
    if not error.logged:
        error.logged = True
        log.error(
            "server fault, error id %s: %s",
            error.error_id,
            error.message,
            exc_info=cause if cause is not None else (error if error.__traceback__ is not None else None),
            extra={"fields": {"error_id": error.error_id}},
        )
    return error
