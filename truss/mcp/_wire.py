"""One connection's messages as Truss sees them: which request an answer is for, which errors the
server itself sent, and a bounded reader for a stdio server's output.

``Wire`` (one per connection) learns every request Truss sends (through ``TapWrite``, which runs
in the sending task, so it also learns which call a request belongs to: ``CALL_SLOT``) and every
answer the server sends. It is how a JSON-RPC error *response* is told apart from the SDK's own
errors that reuse its codes (the SDK raises ``-32000`` when a connection closes and ``-32001``
when a request times out, and a server may answer with either): an error the server sent for a
call's request is noted in that call's ``CallSlot``.

``LineReader`` is the stdio server's stdout, split into messages, sans-IO: bytes in, messages
out, in time linear in the bytes and never holding more than one message's bound. A message that
answers a ``tools/call`` (or ``tasks/result``) may be ``call_limit`` bytes (``max_result_bytes``
plus ``ENVELOPE_BYTES``); any other ``message_limit`` (at least ``MAX_MESSAGE_BYTES``). A message
over its bound is refused as soon as it passes it when its id comes first (the Python SDK's
order), or at its end when the id comes last (the TypeScript SDK's); the rest of the line is read
and dropped as it arrives. A line that cannot be parsed (not JSON, nested past the parser's limit
of about 200 levels, not a JSON-RPC message) but whose id names a request in flight fails that
request at once. Either way the request gets an error answer that only Truss can make (its data
carries the connection's ``nonce``, never sent to the server): ``refusal(exc)`` reads it back. A
line with no readable id is handed on as an exception, as the SDK does (counted as garbage).

What this module does not do: start processes or touch pipes (``truss.mcp._stdio`` does), or
decide what a refused call records (``truss.mcp.client`` does).
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, cast

from mcp import MCPError, types
from mcp.shared.message import SessionMessage

__all__ = [
    "CALL_SLOT",
    "ENVELOPE_BYTES",
    "MAX_MESSAGE_BYTES",
    "CallSlot",
    "LineReader",
    "Refusal",
    "TapRead",
    "TapWrite",
    "Wire",
]

ENVELOPE_BYTES = 65_536
"""What a tool result's message may hold beyond ``max_result_bytes``: the JSON-RPC envelope, ``_meta``."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The bound of every other message from a server (a ``tools/list`` page, a notification)."""

_CALL_METHODS = frozenset({"tools/call", "tasks/result"})
_HEAD_BYTES = 4096
_TAIL_BYTES = 512
_MAX_IN_FLIGHT = 4096
_REFUSED_CODE = types.INTERNAL_ERROR
# The id as the first member (after "jsonrpc"), or as the last (before or after "jsonrpc").
_ID = rb'(-?\d{1,20}|"(?:[^"\\]|\\.){0,256}")'
_HEAD_ID_RE = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_TAIL_ID_RE = re.compile(rb'[,{]\s*"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')
# What the SDK's Streamable HTTP transport says when it answers a request itself (it uses -32000 too).
_HTTP_OWN_ERRORS = ("SSE stream", "server answered a request with 202", "Not Found", "Session terminated",
                    "Server returned an error response", "Unexpected content type", "Failed to parse")  # fmt: skip


@dataclass
class CallSlot:
    """One call, as the wire saw it: the error the server answered its request with, if any."""

    server_error: tuple[int, str] | None = None


CALL_SLOT: contextvars.ContextVar[CallSlot | None] = contextvars.ContextVar("truss_mcp_call_slot", default=None)


@dataclass(frozen=True)
class Refusal:
    """An answer Truss refused before handing it on: ``reason`` is ``too_large`` or ``unparsable``."""

    reason: str
    size: int
    limit: int


def _key(request_id: Any) -> str:
    return str(request_id)


@dataclass
class Wire:
    """What one connection has in flight (module docstring). ``nonce`` marks Truss's own answers."""

    nonce: str
    call_limit: int
    message_limit: int = MAX_MESSAGE_BYTES
    methods: dict[str, str] = field(default_factory=dict[str, str])
    slots: dict[str, CallSlot] = field(default_factory=dict[str, CallSlot])

    def __post_init__(self) -> None:
        self.message_limit = max(self.message_limit, self.call_limit)

    def sent(self, message: Any) -> None:
        """Note a message Truss sends (called in the sending task)."""
        if isinstance(message, types.JSONRPCRequest):
            key = _key(message.id)
            if len(self.methods) >= _MAX_IN_FLIGHT:  # requests never answered (a server that drops them)
                oldest = next(iter(self.methods))
                self.methods.pop(oldest)
                self.slots.pop(oldest, None)
            self.methods[key] = message.method
            slot = CALL_SLOT.get()
            if slot is not None:
                self.slots[key] = slot
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            params: Any = message.params or {}
            if isinstance(params, dict) and "requestId" in params:
                self._done(_key(cast(dict[str, Any], params)["requestId"]))

    def received(self, message: Any, *, from_server: bool = True) -> None:
        """Note a message from the server (``from_server=False``: the transport made it up)."""
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id is not None:
            key = _key(message.id)
            slot = self.slots.get(key)
            if isinstance(message, types.JSONRPCError) and from_server and slot is not None:
                slot.server_error = (message.error.code, message.error.message)
            self._done(key)

    def method_of(self, request_id: Any) -> str | None:
        return self.methods.get(_key(request_id))

    def _done(self, key: str) -> None:
        self.methods.pop(key, None)
        self.slots.pop(key, None)

    def refuse(self, request_id: Any, refusal: Refusal) -> SessionMessage:
        """Truss's own error answer to ``request_id`` (what ``refusal(exc)`` reads back)."""
        self._done(_key(request_id))
        text = (
            f"the server's answer was over {refusal.limit} bytes"
            if refusal.reason == "too_large"
            else "the server's answer is not a valid JSON-RPC message"
        )
        data = {"truss": self.nonce, "reason": refusal.reason, "size": refusal.size, "limit": refusal.limit}
        error = types.ErrorData(code=_REFUSED_CODE, message=text, data=data)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    def refusal(self, exc: BaseException) -> Refusal | None:
        """The refusal ``exc`` carries when it is Truss's own answer on this connection, else None."""
        raw: Any = exc.data if isinstance(exc, MCPError) and exc.code == _REFUSED_CODE else None
        if not isinstance(raw, dict):
            return None
        data = cast(dict[str, Any], raw)
        if data.get("truss") != self.nonce:
            return None
        size, limit = data.get("size"), data.get("limit")
        return Refusal(str(data.get("reason")), size if type(size) is int else 0, limit if type(limit) is int else 0)


def _sniff(pattern: re.Pattern[bytes], data: bytes) -> Any:
    match = pattern.search(data)
    if match is None:
        return None
    try:
        value: Any = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


class LineReader:
    """A stdio server's stdout, split into messages within their bounds (module docstring)."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._line = bytearray()
        self._skipping = False
        self._skipped = 0
        self._tail = b""
        self._refused_id: Any = None
        self._answered = False

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the line being read (never more than its bound plus one read)."""
        return len(self._line) + len(self._tail)

    def feed(self, chunk: bytes) -> Iterator[SessionMessage | Exception]:
        """The messages that ``chunk`` completes, in order."""
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self._skipping:
                self._skipped += len(piece)
                self._tail = (self._tail + piece)[-_TAIL_BYTES:]
            else:
                self._line += piece
                early = self._over_bound()
                if early is not None:
                    yield early
            if end < 0:
                return
            item = self._finish()
            if item is not None:
                yield item
            start = end + 1

    def _over_bound(self) -> SessionMessage | None:
        """Start dropping the line once it is over its bound; answer its request now if its id came first."""
        wire = self._wire
        size = len(self._line)
        if size <= wire.call_limit:
            return None
        head = bytes(self._line[:_HEAD_BYTES])
        request_id = _sniff(_HEAD_ID_RE, head)
        method = wire.method_of(request_id) if request_id is not None else None
        limit = wire.call_limit if method in _CALL_METHODS else wire.message_limit
        if size <= limit:
            return None
        self._skipping = True
        self._skipped = size
        self._tail = bytes(self._line[-_TAIL_BYTES:])
        self._line = bytearray()
        if method is None:
            return None  # no id seen yet (or not one in flight): perhaps at the end of the line
        self._refused_id = request_id
        self._answered = True
        return wire.refuse(request_id, Refusal("too_large", limit, limit))

    def _finish(self) -> SessionMessage | Exception | None:
        """The message of the line that just ended, an error answer for its request, or None."""
        wire = self._wire
        if self._skipping:
            size, tail, answered = self._skipped, self._tail, self._answered
            self._skipping, self._skipped, self._tail, self._answered = False, 0, b"", False
            self._refused_id = None
            if answered:
                return None
            request_id = _sniff(_TAIL_ID_RE, tail)
            if request_id is not None and wire.method_of(request_id) is not None:
                method = wire.method_of(request_id)
                limit = wire.call_limit if method in _CALL_METHODS else wire.message_limit
                return wire.refuse(request_id, Refusal("too_large", size, limit))
            return ValueError(f"a message of {size} bytes from the server was over its bound and dropped")
        data = bytes(self._line)
        self._line = bytearray()
        if not data.strip():
            return None
        if len(data) > wire.call_limit:
            request_id = _sniff(_TAIL_ID_RE, data[-_TAIL_BYTES:])
            if request_id is not None and wire.method_of(request_id) in _CALL_METHODS:
                return wire.refuse(request_id, Refusal("too_large", len(data), wire.call_limit))
        try:
            message = types.jsonrpc_message_adapter.validate_json(data.decode("utf-8", "replace"), by_name=False)
        except ValueError as exc:  # pydantic's ValidationError is one
            request_id = _sniff(_HEAD_ID_RE, data[:_HEAD_BYTES])
            if request_id is None:
                request_id = _sniff(_TAIL_ID_RE, data[-_TAIL_BYTES:])
            if request_id is not None and wire.method_of(request_id) is not None:
                return wire.refuse(request_id, Refusal("unparsable", len(data), wire.message_limit))
            return exc
        wire.received(message)
        return SessionMessage(message)


class TapWrite:
    """The write stream the SDK's session sends through, telling ``Wire`` each message first."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def send(self, item: SessionMessage, /) -> None:
        self._wire.sent(item.message)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)


class TapRead:
    """The read stream of a transport Truss does not read itself (Streamable HTTP), telling ``Wire``
    each message; errors the SDK's HTTP transport makes up itself are told apart by their text."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def receive(self) -> SessionMessage | Exception:
        item: SessionMessage | Exception = await self._inner.receive()
        if isinstance(item, SessionMessage):
            message = item.message
            own = (
                isinstance(message, types.JSONRPCError)
                and message.error.data is None
                and (message.error.message.startswith(_HTTP_OWN_ERRORS))
            )
            self._wire.received(message, from_server=not own)
        return item

    @property
    def last_context(self) -> Any:  # the dispatcher reads the sender's context this way when there is one
        return getattr(self._inner, "last_context", None)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)
