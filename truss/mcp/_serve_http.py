"""serve-mcp over Streamable HTTP: the listening socket, bearer tokens, the SSE replay buffer.

``serve_http`` runs a ``ServeApp`` (``truss.mcp.server``) behind uvicorn on ``host:port``. Every
request needs ``Authorization: Bearer <token>`` whose hash is in the tokens table (``_BearerGate``
answers 401 before anything reaches the MCP layer), unless the loopback-only ``--unsafe-no-auth``
mode gives every caller one fixed principal. SIGINT or SIGTERM stops the server as over stdio:
the runs still in progress (detached, or with a caller's request open) are asked to stop and
record themselves interrupted (resumable by handle), uvicorn stops listening and answers what it
can within its grace, and the process exits 0. The signals are Truss's, not uvicorn's: uvicorn
would re-raise them after it stopped, killing the process before the runs were recorded.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Generator
from contextvars import ContextVar
from typing import Any

import anyio
from mcp import types
from mcp.server import ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import EventMessage, EventStore

from truss._clock import Clock
from truss._errors import InputError
from truss.mcp._serve_core import Principal, TokenTable
from truss.mcp.server import ServeApp, ServeConfig, say, serve_app

__all__ = ["serve_http"]

_REQUESTER: ContextVar[Principal | None] = ContextVar("truss_serve_requester", default=None)
"""The principal of the HTTP request being served (set by ``_BearerGate``). A session's own tasks
start inside the request that opened it, so they carry the principal of the session's owner."""


async def serve_http(
    config: ServeConfig,
    *,
    host: str,
    port: int,
    tokens: TokenTable | None,
    fixed_principal: Principal | None = None,
    path: str = "/mcp",
) -> None:
    """Serve Streamable HTTP on ``host:port`` (``port`` 0 picks a free one, printed on stderr).

    Every request needs ``Authorization: Bearer <token>`` whose hash is in ``tokens``; without
    one the answer is 401 and nothing reaches the MCP layer. ``fixed_principal`` without tokens
    is the ``--unsafe-no-auth`` mode for loopback testing (everyone is that one principal).
    """
    import socket

    import uvicorn

    class _QuietServer(uvicorn.Server):
        """uvicorn without its own signal handlers (``_stop_on_signal`` is the one)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None]:
            yield

    if tokens is None and fixed_principal is None:
        raise InputError("HTTP needs --tokens FILE", remedy="See docs/serve-mcp.md", what="tokens")

    def principal_of(ctx: ServerRequestContext[Any, Any]) -> Principal | None:
        if tokens is None:
            return fixed_principal
        headers: Any = getattr(ctx.request, "headers", None)
        return tokens.principal_for_header(headers.get("authorization") if headers is not None else None)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port}: {exc.strerror}", remedy="Choose another --port", what="port"
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    bound = sock.getsockname()[1]

    async with serve_app(config, principal_of) as app:
        starlette = app.server.streamable_http_app(
            streamable_http_path=path,
            host=host,
            max_request_body_size=config.limits.max_request_bytes,
            event_store=RecentEvents(config.clock, max_bytes=config.limits.max_replay_bytes),
            retry_interval=1000,
        )
        asgi: Any = _BearerGate(starlette, tokens) if tokens is not None else starlette
        server = _QuietServer(
            uvicorn.Config(
                asgi,
                log_level="warning",
                lifespan="on",
                timeout_graceful_shutdown=5,
                access_log=False,
            )
        )
        say(f"truss serve-mcp: listening on http://{_url_host(host)}:{bound}{path}")
        async with anyio.create_task_group() as watching:
            watching.start_soon(_stop_on_signal, app, server)
            try:
                await server.serve(sockets=[sock])
            finally:
                sock.close()
            watching.cancel_scope.cancel()
        # Stopped: what is still running records itself interrupted (and is resumable).
        await app.shutdown()


async def _stop_on_signal(app: ServeApp, server: Any) -> None:
    """On SIGINT/SIGTERM: ask every run to stop (each records itself interrupted) and uvicorn to
    exit; a second signal makes uvicorn stop waiting for open requests."""
    import signal

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if server.should_exit:
                server.force_exit = True
                continue
            say(f"truss serve-mcp: stopping; interrupting {app.active_runs} run(s) (recorded as interrupted)")
            app.stopping.set()
            server.should_exit = True


class RecentEvents(EventStore):
    """The last SSE events in memory, so a legacy-era client that loses its stream mid-run can
    resume it (``Last-Event-ID``). Event ids are random (from the clock), so one caller cannot
    guess its way into another's stream.

    One buffer serves every session, and the SDK names a stream by its JSON-RPC request id, which
    two sessions reuse all the time: each event is kept with the principal it was sent to, and a
    replay sends only the replaying principal's (an event id of another's is an unknown one).

    The buffer is bounded in events (``limit``) and in bytes (``max_bytes``): events are kept as
    their wire JSON, counted exactly, and the oldest go first (the newest is always kept, whatever
    its size, so a replay never skips the last answer silently). An answer can be as large as
    ``--max-answer-bytes`` twice over (text and structured content), and a caller may ask for one
    as often as it likes.
    """

    def __init__(self, clock: Clock, *, limit: int = 10_000, max_bytes: int = 16_777_216) -> None:
        self._clock = clock
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        self._events: OrderedDict[str, tuple[Any, str | None, Principal | None]] = OrderedDict()

    @property
    def held_bytes(self) -> int:
        """The bytes of wire JSON the buffer holds now."""
        return self._bytes

    async def store_event(self, stream_id: Any, message: Any) -> str:
        event_id = self._clock.new_id("e")
        # As the transport writes it (``_create_event_data``), so a replay sends the same bytes.
        wire = None if message is None else str(message.model_dump_json(by_alias=True, exclude_unset=True))
        self._events[event_id] = (stream_id, wire, _REQUESTER.get())
        self._bytes += len(wire or "")
        while len(self._events) > self._limit or (self._bytes > self._max_bytes and len(self._events) > 1):
            _, (_, dropped, _) = self._events.popitem(last=False)
            self._bytes -= len(dropped or "")
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> Any:
        owner = _REQUESTER.get()
        last = self._events.get(last_event_id)
        if last is None or last[2] != owner:
            return None
        stream_id = last[0]
        after = False
        for event_id, (stream, wire, sent_to) in list(self._events.items()):
            if after and stream == stream_id and sent_to == owner and wire is not None:
                message = types.jsonrpc_message_adapter.validate_json(wire)
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id


class _BearerGate:
    """ASGI wrapper: 401 unless the bearer token maps to a principal (constant-time comparison).

    The principal rides on as the request's ``scope["user"]``, which is what the SDK's session
    manager binds a session to: a request for a session another principal opened (its id leaked,
    say) is answered 404, exactly as an unknown session, so it can neither use nor end it.

    It fails closed: a WebSocket handshake (uvicorn delivers one when a WebSocket library is
    installed, though nothing here serves them) needs the same token, and is refused with the same
    401 where the server can send an HTTP answer to a handshake, else closed with 1008 (policy
    violation) before it is accepted; any other kind of scope but the server's own lifespan
    never reaches the app.
    """

    def __init__(self, inner: Any, tokens: TokenTable) -> None:
        self._inner = inner
        self._tokens = tokens

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._inner(scope, receive, send)
            return
        if kind not in ("http", "websocket"):
            return
        auth: bytes | None = None
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                auth = value
                break
        principal = self._tokens.principal_for_header(auth.decode("latin-1") if auth is not None else None)
        if principal is None:
            await _unauthorized(scope, send)
            return
        scope = {**scope, "user": _user_of(principal)}
        requester = _REQUESTER.set(principal)
        try:
            await self._inner(scope, receive, send)
        finally:
            _REQUESTER.reset(requester)


async def _unauthorized(scope: Any, send: Any) -> None:
    prefix = "http"
    if scope["type"] == "websocket":
        if "websocket.http.response" not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        prefix = "websocket.http"
    body = json.dumps({"error": "unauthorized", "error_description": "a valid bearer token is required"}).encode()
    await send(
        {
            "type": f"{prefix}.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b'Bearer error="invalid_token"'),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": f"{prefix}.response.body", "body": body})


def _user_of(principal: Principal) -> AuthenticatedUser:
    """The SDK's authenticated user for ``principal`` (no token in it: the session owner is the principal)."""
    subject = f"{principal.tenant}/{principal.user}"  # '/' is in neither part (Principal's pattern)
    return AuthenticatedUser(AccessToken(token="", client_id="truss-serve-mcp", scopes=[], subject=subject))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
