"""The egress proxy of one confined server: HTTP CONNECT and plain HTTP, to ``allow_hosts`` only.

Truss runs one per server with network ``allow``. It serves the listening socket the sandbox's
supervisor made at ``127.0.0.1:3128`` inside the sandbox's network namespace and handed over
(``truss.mcp.sandbox._confine``), so ordinary clients reach it with ``HTTPS_PROXY``. The
sandbox has no other way out: its network namespace holds only loopback.

Each connection attempt becomes one ``EgressEvent`` (server, host, port, decision, reason, bytes
each way, duration; never a payload, header or path): ``refused`` when no rule allows the host
and port (or an allowed *name* resolves to a loopback, link-local, multicast or unspecified
address: a DNS answer must not turn an allowed host into Truss's own machine), ``failed`` when an
allowed host cannot be resolved or reached, ``allowed`` otherwise, reported when the connection
ends. Past ``max_events`` attempts the rest are counted per (host, port, decision) and reported
as ``EgressSummary`` values when the proxy stops, so a flood costs a bounded number of records.

Plain HTTP is one request per connection: the proxy sends the origin ``Connection: close`` and
drops ``Proxy-*`` headers, so a second request on the same connection cannot reach another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from truss._clock import Clock
from truss._sandbox_profile import HostRule, match_host

__all__ = [
    "MAX_EGRESS_EVENTS",
    "MAX_SUMMARY_KEYS",
    "EgressEvent",
    "EgressProxy",
    "EgressSummary",
    "SandboxEvent",
]

MAX_EGRESS_EVENTS = 1000
MAX_SUMMARY_KEYS = 256
MAX_TUNNELS = 64
_HEAD_LIMIT = 16 * 1024
_HEAD_TIMEOUT_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_CLOSE_TIMEOUT_S = 10.0  # for what a tunnel still has buffered when it ends


@dataclass(frozen=True)
class EgressEvent:
    """One connection attempt through the proxy. ``decision``: allowed, refused or failed."""

    server: str
    host: str
    port: int
    decision: str
    reason: str | None
    bytes_up: int
    bytes_down: int
    duration_ms: int
    method: str

    def as_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "host": self.host,
            "port": self.port,
            "decision": self.decision,
            "reason": self.reason,
            "method": self.method,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True)
class EgressSummary:
    """Attempts past the per-sandbox bound, counted per (host, port, decision); ``host`` ``*`` = the rest."""

    server: str
    host: str
    port: int
    decision: str
    attempts: int
    bytes_up: int
    bytes_down: int

    def as_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "host": self.host,
            "port": self.port,
            "decision": self.decision,
            "attempts": self.attempts,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


SandboxEvent = EgressEvent | EgressSummary
EventSink = Callable[[SandboxEvent], Awaitable[None] | None]


class _BadRequest(Exception):
    pass


@dataclass
class _Count:
    attempts: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class EgressProxy:
    """Serves one sandbox's Unix socket until cancelled; ``flush`` reports the summaries."""

    def __init__(
        self,
        server: str,
        rules: Sequence[HostRule],
        clock: Clock,
        on_event: EventSink | None,
        *,
        max_events: int = MAX_EGRESS_EVENTS,
        max_tunnels: int = MAX_TUNNELS,
    ) -> None:
        self.server = server
        self.rules = tuple(rules)
        self.clock = clock
        self.on_event = on_event
        self.max_events = max_events
        self.reported = 0
        self.summary: dict[tuple[str, int, str], _Count] = {}
        self._tunnels = anyio.Semaphore(max_tunnels)
        self._send, self._receive = anyio.create_memory_object_stream[SandboxEvent](max_events + MAX_SUMMARY_KEYS + 1)

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accept on ``listener``'s socket and handle each connection in a task of its own, until cancelled."""
        raw: socket.socket = listener.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - anyio, not Django
        loop = asyncio.get_running_loop()
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(self._deliver)
            while True:
                try:
                    client, _ = await loop.sock_accept(raw)
                except (ConnectionAbortedError, InterruptedError):
                    continue
                client.setblocking(False)
                if client.family in (socket.AF_INET, socket.AF_INET6):
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each TLS flight at once
                tg.start_soon(self._handle, client)

    async def _deliver(self) -> None:
        async for event in self._receive:
            await self._call(event)

    async def _call(self, event: SandboxEvent) -> None:
        if self.on_event is None:
            return
        result = self.on_event(event)
        if inspect.isawaitable(result):
            await result

    async def flush(self) -> None:
        """Report what was counted past the bound, and any event still queued, in order."""
        with anyio.CancelScope(shield=True):
            while True:
                try:
                    queued = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                await self._call(queued)
            for (host, port, decision), count in sorted(self.summary.items()):
                await self._call(
                    EgressSummary(self.server, host, port, decision, count.attempts, count.bytes_up, count.bytes_down)
                )
            self.summary.clear()
            self._send.close()
            self._receive.close()

    def _record(self, event: EgressEvent) -> None:
        if self.reported < self.max_events:
            self.reported += 1
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._send.send_nowait(event)
                return
        key = (event.host, event.port, event.decision)
        if key not in self.summary and len(self.summary) >= MAX_SUMMARY_KEYS:
            key = ("*", 0, event.decision)
        count = self.summary.setdefault(key, _Count())
        count.attempts += 1
        count.bytes_up += event.bytes_up
        count.bytes_down += event.bytes_down

    async def _handle(self, client: socket.socket) -> None:
        started = self.clock.monotonic()
        host, port, method = "", 0, ""
        up = down = 0

        def done(decision: str, reason: str | None) -> None:
            self._record(
                EgressEvent(
                    self.server,
                    host,
                    port,
                    decision,
                    reason,
                    up,
                    down,
                    int((self.clock.monotonic() - started) * 1000),
                    method,
                )
            )

        loop = asyncio.get_running_loop()
        with client:
            try:
                with anyio.fail_after(_HEAD_TIMEOUT_S):
                    head, rest = await _read_head(loop, client)
                method, host, port, forward = _parse(head)
            except (_BadRequest, TimeoutError, OSError) as exc:
                with contextlib.suppress(OSError):
                    client.send(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                done("refused", "bad_request" if isinstance(exc, _BadRequest) else "incomplete_request")
                return
            rule = match_host(self.rules, host, port)
            if rule is None:
                await _answer(loop, client, 403, f"egress to {host}:{port} is not allowed by this server's sandbox")
                done("refused", "not_allowed")
                return
            if self._tunnels.value == 0:
                await _answer(loop, client, 503, "too many connections through this sandbox's proxy")
                done("refused", "busy")
                return
            async with self._tunnels:
                try:
                    address = await _resolve(host, port, literal=rule.is_literal)
                except _Internal:
                    await _answer(loop, client, 403, f"{host} resolves to an internal address")
                    done("refused", "resolves_to_internal")
                    return
                except OSError:
                    await _answer(loop, client, 502, f"cannot resolve {host}")
                    done("failed", "resolve_failed")
                    return
                try:
                    with anyio.fail_after(_CONNECT_TIMEOUT_S):
                        upstream = await _connect(loop, address, port)
                except (OSError, TimeoutError):
                    await _answer(loop, client, 502, f"cannot connect to {host}:{port}")
                    done("failed", "connect_failed")
                    return
                with upstream:
                    try:
                        if method == "CONNECT":
                            await loop.sock_sendall(client, b"HTTP/1.1 200 Connection established\r\n\r\n")
                        else:
                            await loop.sock_sendall(upstream, forward)
                            up += len(forward)
                        if rest:
                            await loop.sock_sendall(upstream, rest)
                            up += len(rest)
                    except OSError:
                        done("allowed", "closed_early")
                        return
                    tunnel = _Tunnel(loop)
                    try:
                        await tunnel.run(client, upstream)
                    finally:
                        up += tunnel.counts[0]
                        down += tunnel.counts[1]
                        done("allowed", None)


class _Tunnel:
    """The bytes of one allowed connection, both ways, copied in the event loop's callbacks.

    Each side is an asyncio transport whose protocol writes what it receives straight to the
    other side's transport: no task switch, no await and no extra copy per chunk (the proxy's
    cost is per round trip, so this is the data path to keep short). A side whose peer cannot
    keep up stops reading until the peer's buffer drains (the transports' flow control); an end
    of stream is passed on as a half close; the tunnel ends when both ways have ended or either
    connection is lost, and the sockets are closed (by the caller) after it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.counts = [0, 0]  # bytes client -> upstream, upstream -> client
        self.ended = [False, False]
        self.finished = loop.create_future()  # both ways ended, or a connection lost
        self.closed = loop.create_future()  # both transports closed
        self.halves: list[_Half] = []
        self.lost = 0

    async def run(self, client: socket.socket, upstream: socket.socket) -> None:
        # The transports own duplicates of the caller's sockets, which close them as before.
        sides: list[asyncio.Transport] = []
        try:
            for index, sock in enumerate((client, upstream)):
                half = _Half(self, index)
                self.halves.append(half)
                transport, _ = await self.loop.connect_accepted_socket(lambda h=half: h, sock.dup())
                sides.append(transport)
            for half in self.halves:
                half.ready()
            await self.finished
            for transport in sides:
                transport.close()  # after what is still buffered for it is sent
            with anyio.move_on_after(_CLOSE_TIMEOUT_S):
                await self.closed
        finally:
            for transport in sides:
                transport.abort()  # a peer that reads nothing does not keep its transport alive
            for future in (self.finished, self.closed):
                if not future.done():
                    future.cancel()

    def end(self, index: int) -> None:
        self.ended[index] = True
        if all(self.ended):
            self.finish()

    def finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def gone(self) -> None:
        self.lost += 1
        self.finish()
        if self.lost == 2 and not self.closed.done():
            self.closed.set_result(None)


class _Half(asyncio.Protocol):
    """One side of a ``_Tunnel``: ``index`` 0 is the client, 1 the upstream."""

    def __init__(self, tunnel: _Tunnel, index: int) -> None:
        self.tunnel = tunnel
        self.index = index
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what arrived before the other side's transport existed
        self.early_eof = False

    @property
    def peer(self) -> _Half | None:
        halves = self.tunnel.halves
        other = halves[1 - self.index] if len(halves) == 2 else None
        return other if other is not None and other.transport is not None else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def ready(self) -> None:
        """Both transports exist: pass on what arrived before."""
        early, self.early = self.early, []
        for data in early:
            self.data_received(data)
        if self.early_eof:
            self.eof_received()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None:
            self.early.append(data)
            return
        assert peer.transport is not None
        if not peer.transport.is_closing():
            self.tunnel.counts[self.index] += len(data)
            peer.transport.write(data)

    def eof_received(self) -> bool:
        peer = self.peer
        if peer is None:
            self.early_eof = True
            return True
        assert peer.transport is not None
        if not peer.transport.is_closing() and peer.transport.can_write_eof():
            peer.transport.write_eof()
        self.tunnel.end(self.index)
        return True  # keep this side open: the other way may still be sending

    def pause_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.tunnel.gone()


class _Internal(Exception):
    pass


async def _answer(loop: asyncio.AbstractEventLoop, client: socket.socket, status: int, text: str) -> None:
    reason = {403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = f"truss sandbox: {text}\n".encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError), anyio.move_on_after(_HEAD_TIMEOUT_S):
        await loop.sock_sendall(client, head.encode() + b"Connection: close\r\n\r\n" + body)


async def _read_head(loop: asyncio.AbstractEventLoop, client: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > _HEAD_LIMIT:
            raise _BadRequest("request head too large")
        chunk = await loop.sock_recv(client, _HEAD_LIMIT)
        if not chunk:
            raise ConnectionResetError("the client closed before the end of its request head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


async def _connect(loop: asyncio.AbstractEventLoop, address: str, port: int) -> socket.socket:
    """A non-blocking TCP connection to ``address`` (an IP address), with Nagle off like the client's."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _parse(head: bytes) -> tuple[str, str, int, bytes]:
    """(method, host, port, bytes to send upstream first) from a proxy request head."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes any byte
        raise _BadRequest(str(exc)) from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("not an HTTP/1 request line")
    method, target, version = parts
    if method == "CONNECT":
        host, port = _authority(target, None)
        return method, host, port, b""
    if not target.lower().startswith("http://"):
        raise _BadRequest("a proxy request needs an absolute http:// URL (https goes through CONNECT)")
    rest = target[len("http://") :]
    authority, slash, path = rest.partition("/")
    host, port = _authority(authority, 80)
    kept = [
        line
        for line in lines[1:]
        if line
        and line.split(":", 1)[0].strip().lower()
        not in ("proxy-connection", "proxy-authorization", "connection", "keep-alive")
    ]
    request = "\r\n".join([f"{method} {slash or '/'}{path} {version}", *kept, "Connection: close", "", ""])
    return method, host, port, request.encode("latin-1")


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    if "@" in text:
        raise _BadRequest("user information in a proxy target")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise _BadRequest("bad IPv6 authority")
        host, port_text = text[1:close], text[close + 1 :].lstrip(":")
    else:
        host, _, port_text = text.partition(":")
    if not port_text:
        if default_port is None:
            raise _BadRequest("CONNECT needs host:port")
        port = default_port
    elif port_text.isdigit() and port_text.isascii() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise _BadRequest("bad port")
    host = host.strip().lower().rstrip(".")
    if not host or len(host) > 253 or any(c in host for c in " \t/\\"):
        raise _BadRequest("bad host")
    return host, port


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified


async def _resolve(host: str, port: int, *, literal: bool) -> str:
    """The address to connect to: the first one ``getaddrinfo`` gives, checked when it came from DNS."""
    try:
        addresses = [str(ipaddress.ip_address(host))]  # an address needs no lookup (nor a worker thread)
    except ValueError:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise OSError("no address")
    if not literal and any(_internal(a) for a in addresses):
        raise _Internal(host)
    return addresses[0]
