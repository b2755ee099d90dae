"""Request messages read off the wire, and the services registered with that reader.

gRPC's own reading (the generated ``add_*Servicer_to_server`` hand it ``Message.FromString``) answers a
message that does not parse with ``UNKNOWN`` and a Python exception class in the details, before any code
of ours runs: grpc.aio calls the deserializer outside the method handler and turns what it raises into
``Unexpected <class '...'>: ...``. Here the deserializer never raises. A message that does not parse
becomes :class:`Unreadable`, which the call refuses through :class:`~app.api.rpc.calls.Calls` as any bad
request is refused (after the drain, the API key and readiness, as HTTP reads its body after them):
``INVALID_ARGUMENT`` with a message that says what is wrong, where, and in which field, as an HTTP body
that is not JSON gets its position and reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from app.api.rpc.calls import Calls
from app.errors import MalformedBody
from app.tasks.service import Service

# protobuf's own limit on nested messages and groups (its default recursion limit).
MAX_DEPTH = 100


@dataclass(frozen=True)
class Unreadable:
    """A request message that did not parse: what was wrong, in the client's terms."""

    message: str

    async def refuse(self, _service: Service) -> Any:
        raise MalformedBody(self.message)


def reader(message_class: type[Message]) -> Callable[[bytes], Message | Unreadable]:
    """A request deserializer for ``message_class`` that answers :class:`Unreadable` instead of raising."""

    def read(raw: bytes) -> Message | Unreadable:
        try:
            return message_class.FromString(raw)
        except (DecodeError, UnicodeDecodeError) as exc:  # upb raises the first, the Python parser either
            return Unreadable(explain(message_class.DESCRIPTOR, raw, exc))

    return read


def explain(descriptor: Descriptor, raw: bytes, exc: Exception) -> str:
    """Why ``raw`` is not a ``descriptor`` message: the first problem a scan of its wire format finds
    (where, and in which field), else the parser's own reason."""
    try:
        _scan(descriptor, raw, 0, len(raw), "", 0, None)
        reason = str(exc).rpartition(": ")[2] or "it does not parse"  # upb: "Error parsing ...: <reason>"
    except _Problem as problem:
        reason = str(problem)
    return f"the request is not a valid {descriptor.full_name} message: {reason}"


class _Problem(Exception):
    pass


def _varint(raw: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while pos < end:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _Problem(f"at byte {start}, {what} (a varint) runs over 10 bytes")
    raise _Problem(f"at byte {start}, the message ends inside {what} (a varint)")


def _scan(
    descriptor: Descriptor | None,
    raw: bytes,
    pos: int,
    end: int,
    prefix: str,
    depth: int,
    group: int | None,
) -> int:
    """Walk the fields of ``raw[pos:end]`` (a ``descriptor`` message; None: unknown fields, read only for
    their extent), raising :class:`_Problem` at the first that is malformed; where it stopped (past the
    end-group tag of ``group``)."""
    if depth > MAX_DEPTH:
        raise _Problem(f"at byte {pos}, messages nest deeper than {MAX_DEPTH} levels")
    seen: dict[int, int] = {}
    while pos < end:
        at = pos
        key, pos = _varint(raw, pos, end, "a field's key")
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Problem(f"at byte {at}, a field has number 0, which no field can have")
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        index = seen[number] = seen.get(number, -1) + 1
        path = _path(field, index, prefix)
        name = f"field {path} ({number})" if field is not None else f"field {number}"
        if wire == 0:
            _, pos = _varint(raw, pos, end, name)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise _Problem(
                    f"at byte {at}, {name} needs {size} bytes and the message has {_bytes(end - pos)} left"
                )
            pos += size
        elif wire == 2:
            length, pos = _varint(raw, pos, end, f"the length of {name}")
            if pos + length > end:
                raise _Problem(
                    f"at byte {at}, {name} is {_bytes(length)} long and the message has {_bytes(end - pos)} left"
                )
            if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                _utf8(raw[pos : pos + length], name, pos)
            elif field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                _scan(field.message_type, raw, pos, pos + length, path + ".", depth + 1, None)
            pos += length
        elif wire == 3:
            pos = _scan(None, raw, pos, end, prefix, depth + 1, number)
        elif wire == 4:
            if group != number:
                raise _Problem(f"at byte {at}, a group ends (field {number}) that did not start")
            return pos
        else:
            raise _Problem(f"at byte {at}, {name} has wire type {wire}, which does not exist")
    if group is not None:
        raise _Problem(f"the message ends inside group {group}")
    return pos


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def _path(field: FieldDescriptor | None, index: int, prefix: str) -> str:
    """A known field as a client names it: ``inputs``, ``texts[2]``, ``pairs[1].a``."""
    if field is None:
        return prefix
    return f"{prefix}{field.name}{f'[{index}]' if field.is_repeated else ''}"


def _utf8(value: bytes, name: str, start: int) -> None:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Problem(
            f"{name} is not valid UTF-8: byte {value[exc.start]:#04x} at offset {exc.start} of its "
            f"{_bytes(len(value))} (byte {start + exc.start} of the message); send text as UTF-8"
        ) from None


_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A stream's requests, ending with the refusal of the first that did not parse."""
    async for request in requests:
        if isinstance(request, Unreadable):
            raise MalformedBody(request.message)
        yield request


def _guarded(calls: Calls, path: str, function: Any, streams_in: bool, streams_out: bool) -> Any:
    """``function`` (a servicer method), with its requests checked: an unreadable one refused."""
    if streams_in and streams_out:

        async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            async for answer in function(_checked(requests), context):
                yield answer

        return stream_stream
    if streams_in:

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await function(_checked(requests), context)

        return stream_unary
    if streams_out:

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Unreadable):
                await calls.unary(path, context, request.refuse)  # raises: the call is aborted
                return
            async for answer in function(request, context):
                yield answer

        return unary_stream

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unreadable):
            return await calls.unary(path, context, request.refuse)
        return await function(request, context)

    return unary_unary


def register(server: grpc.aio.Server, calls: Calls, servicer: Any, service: ServiceDescriptor) -> str:
    """Serve ``service``'s methods by ``servicer``'s methods of the same names, reading each request with
    :func:`reader` (what the generated ``add_*Servicer_to_server`` does, with gRPC's own reading); the
    service's full name."""
    handlers = {}
    for method in service.methods:
        streams = (method.client_streaming, method.server_streaming)
        path = f"/{service.full_name}/{method.name}"
        handlers[method.name] = _HANDLERS[streams](
            _guarded(calls, path, getattr(servicer, method.name), *streams),
            request_deserializer=reader(GetMessageClass(method.input_type)),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return service.full_name
