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
ends (an end within 50 ms of one already reported waits for the end of that window, to be reported
with the others, in order; refusals and failures go at once). Past ``max_events`` attempts the
rest are counted per (host, port, decision) and reported as ``EgressSummary`` values when the
proxy stops, so a flood costs a bounded number of records.

Plain HTTP is one request per connection: the proxy sends the origin ``Connection: close`` and
drops ``Proxy-*`` headers, so a second request on the same connection cannot reach another host.
"""

from __future__ import annotations

import _socket
import asyncio
import collections
import contextlib
import errno
import inspect
import ipaddress
import select
import socket
import threading
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
# A connection's sockets are the C type itself: socket.py's subclass adds a Python __init__ and
# close and enum-converting properties, which a proxy pays on every connection and uses none of.
_Sock = _socket.socket
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
    """Serves one sandbox's listening socket until cancelled; ``flush`` reports the summaries.

    The event loop only reports. Worker threads do the rest with plain sockets: every idle
    worker waits in ``accept`` on the listener (the kernel wakes one per connection), handles the
    connection it got (read the head, decide, resolve, connect, answer), copies an allowed one
    both ways in the same thread with ``poll``, and goes back to ``accept``. No thread hands a
    connection or a role to another; a worker starts a new one only when it leaves none idle. A
    message crossing the proxy costs one thread wakeup and two system calls (three with the
    ``poll``), not an event-loop turn with its callbacks, futures and transports, nor a handoff
    between threads: the proxy's cost is per round trip, so this is the path to keep short. Every
    socket stays in blocking mode and each call that must not block says so (``MSG_DONTWAIT``),
    waiting with ``poll`` and a deadline when it would: no ``fcntl`` flips per connection. Events
    go back to the loop once per connection, the ends of tunnels that follow each other closely
    together (``_open_window``).
    """

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
        self.max_tunnels = max_tunnels
        self.reported = 0
        self.summary: dict[tuple[str, int, str], _Count] = {}
        self._send, self._receive = anyio.create_memory_object_stream[SandboxEvent](max_events + MAX_SUMMARY_KEYS + 1)
        self._lock = threading.Lock()
        self._live: set[_Conn] = set()  # connections not yet reported
        self._tunnels = 0
        self._pending = 0  # connections before their tunnel (head, decision, connect)
        # Ended connections for the loop, made into events there: (connection, decision, reason, ms).
        self._done: collections.deque[tuple[_Conn, str, str | None, int]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        # Every pending connection and every tunnel holds one worker, and one more waits in accept;
        # the slack covers workers that have reported a connection but not yet returned to accept.
        self._max_workers = max_tunnels + _MAX_PENDING + 1 + _POOL_SLACK
        self._workers = 0  # threads started and not yet ended
        self._idle = 0  # workers in accept, or committed to calling it (the listener must outlive them)
        self._off_listener = threading.Condition(self._lock)  # notified when _idle drops to 0 while stopping
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._stopping = False
        self._window = False  # tunnel ends are being batched: the loop will drain them (under _lock)
        self._window_timer: asyncio.TimerHandle | None = None
        self._rules_seen: dict[tuple[str, int], tuple[HostRule, str | None] | None] = {}

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accept on ``listener``'s socket in the proxy's worker threads, until cancelled."""
        raw: socket.socket = listener.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - anyio, not Django
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread = loop, threading.get_ident()
        raw.setblocking(True)  # idle workers wait in accept(2) themselves
        self._listener = raw
        if raw.family in (socket.AF_INET, socket.AF_INET6):
            # Each TLS flight at once. Set on the listener, since every connection accepted from
            # it inherits the option (Linux): no setsockopt per connection.
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(self._deliver)
            # Two from the start: a worker busy with one connection leaves the other in accept, and
            # then comes back to accept itself, so one connection after another starts no thread.
            with self._lock:
                started = self._spawn(raw)
                self._spawn(raw)
            if not started:
                raise RuntimeError("the egress proxy could not start a worker thread")
            try:
                await anyio.sleep_forever()
            finally:
                self._stop()

    def _spawn(self, raw: socket.socket) -> bool:
        """Start a worker that will wait in accept (under ``_lock``); False at the bound or when stopping."""
        if self._stopping or self._workers >= self._max_workers:
            return False
        self._workers += 1
        self._idle += 1
        try:
            threading.Thread(target=self._work, args=(raw,), name="truss-egress", daemon=True).start()
        except RuntimeError:  # the system cannot start another thread now: as if at the bound
            self._workers -= 1
            self._idle -= 1
            return False
        return True

    def _work(self, raw: socket.socket) -> None:
        """A worker (counted in ``_idle`` when it starts): accept, handle that connection here, again.

        The head is read by the thread the kernel woke for the connection, with no event-loop
        turn and no other thread's wakeup between the client's connect and the proxy's first
        ``recv``. A worker that takes a connection and leaves no other one in accept starts one
        first; at the bound it refuses the connection as busy and stays in accept itself.
        """
        idle = True  # counted in _idle: may call accept, so the listener must stay open
        family = int(raw.family)
        # accept(2) giving the descriptor: socket.py's accept wraps it in its Python subclass.
        accept_fd: Callable[[], tuple[int, object]] = getattr(raw, "_accept")  # noqa: B009 - not in the stubs
        bufs = (memoryview(bytearray(_CHUNK)), memoryview(bytearray(_CHUNK)))  # this worker's tunnels', reused
        try:
            while True:
                try:
                    fd, _ = accept_fd()
                    client = _Sock(family, socket.SOCK_STREAM, 0, fd)
                except OSError:
                    if self._stopping:
                        return
                    self._stopped.wait(_ACCEPT_RETRY_S)  # ECONNABORTED, or out of descriptors: try again soon
                    continue
                conn = self._admit(client, raw)
                if conn is None:
                    continue  # refused as busy: still counted idle, back to accept
                idle = False
                try:  # noqa: SIM105 - per connection: contextlib.suppress builds an object each time
                    self._handle(conn, bufs)
                except Exception:  # noqa: S110 - a worker must survive any one connection
                    pass
                with self._lock:
                    if self._stopping:
                        return
                    self._idle += 1
                    idle = True
        finally:
            with self._lock:
                self._workers -= 1
                if idle:
                    self._idle -= 1
                    if self._idle == 0:
                        self._off_listener.notify_all()

    def _admit(self, client: _Sock, raw: socket.socket) -> _Conn | None:
        """A connection this worker (idle until now) takes, or None when refused as busy."""
        conn = _Conn(client, self.clock)
        with self._lock:
            # With no other worker left in accept, start one before taking this connection: a
            # worker must stay there to answer the next one (if only with 503).
            admitted = self._pending < _MAX_PENDING and not self._stopping and (self._idle > 1 or self._spawn(raw))
            if admitted:
                self._idle -= 1
                self._pending += 1
                self._live.add(conn)
        if admitted:
            return conn
        self._refuse_busy(conn)
        return None

    def _refuse_busy(self, conn: _Conn) -> None:
        with contextlib.suppress(OSError):
            conn.client.send(
                _answer_bytes(503, "too many connections through this sandbox's proxy"), socket.MSG_DONTWAIT
            )
        with self._lock:
            if conn in self._live:
                self._live.discard(conn)
                self._pending -= 1
            self._done.append(self._ended(conn, "refused", "busy"))
        conn.close()
        self._wake_loop()

    def _stop(self) -> None:
        """On cancellation: report what is still open (bytes so far) and cut it off; end the workers."""
        with self._lock:
            self._stopping = True
            live = list(self._live)
        self._stopped.set()
        for conn in live:
            self._finish(conn, "allowed" if conn.tunnel else "failed", None if conn.tunnel else "stopped")
            conn.cut()
        listener = self._listener
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # accept(2) returns (EINVAL) in every idle worker
            with self._lock:  # before the listener is closed: never a reused descriptor
                self._off_listener.wait_for(lambda: self._idle == 0, _CLOSE_TIMEOUT_S)
        if self._window_timer is not None:
            self._window_timer.cancel()
        self._drain()  # what the window held, in order

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
            self._drain()
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

    def _ended(self, conn: _Conn, decision: str, reason: str | None) -> tuple[_Conn, str, str | None, int]:
        """What a worker records of an ended connection; the loop makes the event of it (``_drain``),
        off the path of the requests that follow."""
        return conn, decision, reason, int((self.clock.monotonic() - conn.started) * 1000)

    def _finish(self, conn: _Conn, decision: str, reason: str | None) -> None:
        """Report ``conn`` once (from a worker, or from the loop when the proxy stops)."""
        with self._lock:
            if conn not in self._live:
                return
            self._live.discard(conn)
            if conn.tunnel:
                self._tunnels -= 1
            else:
                self._pending -= 1
            self._done.append(self._ended(conn, decision, reason))
            then = self._drain
            if decision == "allowed" and threading.get_ident() != self._loop_thread:
                if self._window:
                    return  # the loop takes it at the end of the window, with the others
                self._window, then = True, self._open_window
        self._wake_loop(then)

    def _wake_loop(self, then: Callable[[], None] | None = None) -> None:
        """Have the loop run ``then`` (default: report what is queued) soon; from a worker only."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is listening any more
                loop.call_soon_threadsafe(then or self._drain)

    # The ends of tunnels are reported in batches: the first one after a quiet spell at once, those
    # that follow within _REPORT_WINDOW_S together at the end of the window (and so on while they
    # keep coming), in the order they ended. A report is a wakeup of the event loop from another
    # thread, and its turn (self-pipe, memory stream, the delivering task) cost ~170 us of CPU per
    # connection here, 40 % of what the proxy spends on a small HTTPS request: one request after
    # another paid it each time, while the next one was starting. Refusals and failures are
    # reported at once, always; stopping reports whatever a window holds.

    def _open_window(self) -> None:
        self._drain()
        loop = self._loop
        if loop is not None:
            self._window_timer = loop.call_later(_REPORT_WINDOW_S, self._close_window)

    def _close_window(self) -> None:
        with self._lock:
            more = bool(self._done)
            if not more:
                self._window = False
        if more:
            self._open_window()

    def _drain(self) -> None:
        while True:
            try:
                conn, decision, reason, duration = self._done.popleft()
            except IndexError:
                return
            up, down = conn.counts
            self._record(
                EgressEvent(self.server, conn.host, conn.port, decision, reason, up, down, duration, conn.method)
            )

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

    def _rule(self, host: str, port: int) -> tuple[HostRule, str | None] | None:
        """The rule allowing ``host:port`` and, when ``host`` is an IP address ``_resolve`` would
        accept, the address to connect to (None: a name, looked up on each connection, or an
        address ``_resolve`` refuses), or None when nothing allows it.

        Remembered per (host, port): neither depends on anything else, and both cost IP parses
        (the address is what ``_resolve`` makes of a literal, where no lookup happens).
        """
        key = (host, port)
        try:
            return self._rules_seen[key]
        except KeyError:
            pass
        rule = match_host(self.rules, host, port)
        found: tuple[HostRule, str | None] | None = None
        if rule is not None:
            address = _literal(host)
            # A literal under a rule for names (``*``) is checked as a DNS answer would be.
            internal = address is not None and not rule.is_literal and _refused(address, _own_addresses())
            found = (rule, None if internal else address)
        if len(self._rules_seen) < MAX_SUMMARY_KEYS:
            self._rules_seen[key] = found
        return found

    def _handle(self, conn: _Conn, bufs: tuple[memoryview, memoryview]) -> None:
        """One connection, in a worker thread: head, decision, resolve, connect, answer, relay."""
        try:
            self._handle_open(conn, bufs)
        finally:
            self._finish(conn, "failed", "stopped")  # a no-op once reported
            if not conn.relayed:  # an orderly end has already half-closed both ways
                conn.cut()
            conn.close()

    def _handle_open(self, conn: _Conn, bufs: tuple[memoryview, memoryview]) -> None:
        client, clock = conn.client, self.clock
        try:
            head, rest = _read_head(client, conn.started + _HEAD_TIMEOUT_S, clock)  # from accept
            conn.method, conn.host, conn.port, forward = _parse(head)
        except (_BadRequest, OSError) as exc:
            with contextlib.suppress(OSError):
                _send_all(client, _BAD_REQUEST, clock.monotonic() + _HEAD_TIMEOUT_S, clock)
            self._finish(conn, "refused", "bad_request" if isinstance(exc, _BadRequest) else "incomplete_request")
            return
        host, port = conn.host, conn.port
        found = self._rule(host, port)
        if found is None:
            _answer(client, clock, 403, f"egress to {host}:{port} is not allowed by this server's sandbox")
            self._finish(conn, "refused", "not_allowed")
            return
        with self._lock:
            opened = self._tunnels < self.max_tunnels and not self._stopping and conn in self._live
            if opened:
                self._tunnels += 1
                self._pending -= 1
                conn.tunnel = True
        if not opened:
            _answer(client, clock, 503, _BUSY)
            self._finish(conn, "refused", "busy")
            return
        rule, address = found
        try:
            if address is None:
                address = _resolve(host, port, rule)
        except _Internal:
            _answer(client, clock, 403, f"{host} resolves to an address of this machine or its local network")
            self._finish(conn, "refused", "resolves_to_internal")
            return
        except OSError:
            _answer(client, clock, 502, f"cannot resolve {host}")
            self._finish(conn, "failed", "resolve_failed")
            return
        try:
            upstream = conn.upstream = _connect(address, port, clock.monotonic() + _CONNECT_TIMEOUT_S, clock)
        except OSError:
            _answer(client, clock, 502, f"cannot connect to {host}:{port}")
            self._finish(conn, "failed", "connect_failed")
            return
        try:
            deadline = clock.monotonic() + _HEAD_TIMEOUT_S
            if conn.method == "CONNECT":
                _send_all(client, _ESTABLISHED, deadline, clock)
            else:
                _send_all(upstream, forward, deadline, clock)
                conn.counts[0] += len(forward)
            if rest:
                _send_all(upstream, rest, deadline, clock)
                conn.counts[0] += len(rest)
        except OSError:
            self._finish(conn, "allowed", "closed_early")
            return
        _relay(conn, client, upstream, bufs)
        self._finish(conn, "allowed", None)


_POOL_SLACK = 8
_REPORT_WINDOW_S = 0.05
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_NOWAIT = socket.MSG_DONTWAIT
_BUSY = "too many connections through this sandbox's proxy"
_ACCEPT_RETRY_S = 0.05
_MAX_PENDING = 64  # connections past accept and before their tunnel (a slow head holds one for 10 s)
_CHUNK = 64 * 1024
_NOT_IN_HOST = frozenset(" \t/\\")


class _Conn:
    """One connection's state, shared by its worker threads and, when the proxy stops, the loop."""

    def __init__(self, client: _Sock, clock: Clock) -> None:
        self.client = client
        self.upstream: _Sock | None = None
        self.clock = clock
        self.started = clock.monotonic()
        self.host, self.port, self.method = "", 0, ""
        self.counts = [0, 0]  # bytes client -> upstream, upstream -> client
        self.tunnel = False
        self.lock = threading.Lock()  # a shutdown never meets a close (a reused descriptor number)
        self.closed = False
        self.relayed = False  # the tunnel ended in order: both ways passed on their end

    def cut(self) -> None:
        """End both ways at once: every blocked ``recv``/``send`` on the two sockets returns."""
        with self.lock:
            if self.closed:
                return
            for sock in (self.client, self.upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for sock in (self.client, self.upstream):
                if sock is not None:
                    sock.close()


def _relay(conn: _Conn, client: _Sock, upstream: _Sock, bufs: tuple[memoryview, memoryview]) -> None:
    """Copy both ways in this one thread until both have ended, with non-blocking sockets and ``poll``.

    An end of stream is passed on as a half close once what came before it is sent; an error ends
    both ways. Once one way has ended, a send the other way's peer has not read for
    ``_CLOSE_TIMEOUT_S`` cuts both off: a peer that reads nothing does not keep the tunnel open.
    One thread per tunnel: a message crossing the proxy wakes one thread, and no two of a
    tunnel's threads ever wait for each other (or for the interpreter lock) on the data path.
    The sockets stay in blocking mode; every ``recv`` and ``send`` here is ``MSG_DONTWAIT``.

    A tunnel spends nearly all its life in one state: both ways open and nothing held back. That
    state has a loop of its own, with both sockets registered once for reading, so a message
    costs the ``poll``, one ``recv`` and one ``send``; the first partial send or end of stream
    leaves it for the general loop, which tracks each way's state.
    """
    socks = (client, upstream)
    fds = (client.fileno(), upstream.fileno())
    counts, now = conn.counts, conn.clock.monotonic
    pending: list[memoryview | None] = [None, None]  # way i: read from socks[i], not yet sent to socks[1 - i]
    stalled: list[float] = [0.0, 0.0]  # when way i's pending bytes were first refused by the peer
    done = [False, False]  # way i has ended and its end was passed on
    eof = [False, False]  # socks[i] has reached its end of stream
    poller = select.poll()
    poller.register(fds[0], select.POLLIN)
    poller.register(fds[1], select.POLLIN)
    masks = [select.POLLIN, select.POLLIN]
    lost = select.POLLERR | select.POLLNVAL
    readable = select.POLLIN | select.POLLHUP
    client_fd = fds[0]
    try:
        steady = True
        while steady:
            for fd, revents in poller.poll():
                if revents & lost:
                    conn.cut()  # a connection lost ends the tunnel
                    return
                if revents & readable:
                    i = 0 if fd == client_fd else 1
                    view, eof[i] = _pump(socks[i], socks[1 - i], bufs[i], counts, i)
                    if view is not None:
                        pending[i], stalled[i], steady = view, now(), False
                    elif eof[i]:
                        _half_close(socks[1 - i])
                        done[i], steady = True, False
        while not (done[0] and done[1]):
            want = [0, 0]
            timeout: float | None = None
            for i in (0, 1):
                if done[i]:
                    continue
                if pending[i] is not None:
                    want[1 - i] |= select.POLLOUT
                    if done[1 - i]:
                        left = stalled[i] + _CLOSE_TIMEOUT_S - now()
                        if left <= 0:
                            conn.cut()
                            return
                        timeout = left if timeout is None else min(timeout, left)
                elif not eof[i]:
                    want[i] |= select.POLLIN
            for k in (0, 1):
                if want[k] != masks[k]:
                    if want[k]:
                        poller.register(fds[k], want[k])
                    elif masks[k] > 0:
                        poller.unregister(fds[k])
                    masks[k] = want[k]
            ready = dict(poller.poll(None if timeout is None else int(timeout * 1000) + 1))
            revents = (ready.get(fds[0], 0), ready.get(fds[1], 0))
            if (revents[0] | revents[1]) & lost:
                conn.cut()  # a connection lost ends the tunnel
                return
            for i in (0, 1):
                if done[i]:
                    continue
                view = pending[i]
                if view is not None:
                    if revents[1 - i] & select.POLLOUT:
                        try:
                            sent = socks[1 - i].send(view, _NOWAIT)
                        except (BlockingIOError, InterruptedError):
                            sent = 0
                        if sent == len(view):
                            pending[i] = None
                        elif sent:
                            pending[i], stalled[i] = view[sent:], now()
                elif not eof[i] and revents[i] & readable:
                    view, eof[i] = _pump(socks[i], socks[1 - i], bufs[i], counts, i)
                    if view is not None:
                        pending[i], stalled[i] = view, now()
                if eof[i] and pending[i] is None:
                    _half_close(socks[1 - i])
                    done[i] = True
    except OSError:
        conn.cut()  # a connection lost (reset, refused write, or the proxy stopping) ends the tunnel
        return
    conn.relayed = True


def _half_close(sock: _Sock) -> None:
    """Pass an end of stream on (a peer already gone makes it moot)."""
    try:  # noqa: SIM105 - per connection, as in the worker
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _pump(src: _Sock, dst: _Sock, buf: memoryview, counts: list[int], i: int) -> tuple[memoryview | None, bool]:
    """Pass on what ``src`` has now: (what ``dst`` did not take yet, or None; ``src`` reached its end).

    Reads on while a read fills the buffer (more is likely waiting), without another ``poll``.
    """
    while True:
        try:
            size = src.recv_into(buf, 0, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            return None, False
        if not size:
            return None, True
        counts[i] += size
        try:
            sent = dst.send(buf[:size], _NOWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < size:
            return buf[sent:size], False
        if size < _CHUNK:
            return None, False


class _Internal(Exception):
    pass


def _answer_bytes(status: int, text: str) -> bytes:
    reason = {403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = f"truss sandbox: {text}\n".encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def _answer(client: _Sock, clock: Clock, status: int, text: str) -> None:
    with contextlib.suppress(OSError):
        _send_all(client, _answer_bytes(status, text), clock.monotonic() + _HEAD_TIMEOUT_S, clock)


def _wait(sock: _Sock, events: int, deadline: float, clock: Clock) -> None:
    """Until ``sock`` is ready for ``events``; ``TimeoutError`` past ``deadline``."""
    left = deadline - clock.monotonic()
    poller = select.poll()
    poller.register(sock.fileno(), events)
    if left <= 0 or not poller.poll(int(left * 1000) + 1):
        raise TimeoutError("the peer did not get ready in time")


def _send_all(sock: _Sock, data: bytes, deadline: float, clock: Clock) -> None:
    """Send all of ``data`` by ``deadline``: usually one ``send``, with a ``poll`` only when the peer lags."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view, _NOWAIT) :]
        except (BlockingIOError, InterruptedError):
            _wait(sock, select.POLLOUT, deadline, clock)


def _read_head(client: _Sock, deadline: float, clock: Clock) -> tuple[bytes, bytes]:
    """The request head and what followed it. Wait, then read: a worker wakes in ``accept`` when
    the client's TCP handshake completes, usually before its request has arrived (four times in
    five under strace), so reading first would mostly cost a failed ``recv`` and its exception."""
    buf = b""
    while True:
        try:
            _wait(client, select.POLLIN, deadline, clock)
        except TimeoutError:
            raise TimeoutError("the request head did not arrive in time") from None
        try:
            chunk = client.recv(_HEAD_LIMIT, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            continue
        if not chunk:
            raise ConnectionResetError("the client closed before the end of its request head")
        buf += chunk
        if b"\r\n\r\n" in buf:
            break
        if len(buf) > _HEAD_LIMIT:
            raise _BadRequest("request head too large")
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _connect(address: str, port: int, deadline: float, clock: Clock) -> _Sock:
    """A TCP connection to ``address`` (an IP address) by ``deadline``, with Nagle off like the client's.

    Made non-blocking and left so (one mode, set once): every call on it is ``MSG_DONTWAIT`` in
    any case, like those on the client's socket, which stays in blocking mode.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = _Sock(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((address, port))
        if code == errno.EINPROGRESS:
            _wait(sock, select.POLLOUT, deadline, clock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, f"connect to {address}:{port} failed")
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
    if not host or len(host) > 253 or not _NOT_IN_HOST.isdisjoint(host):
        raise _BadRequest("bad host")
    if not host.isascii():
        raise _BadRequest("a host name must be ASCII (an internationalised name in its xn-- form)")
    if ":" not in host:  # a name or an IPv4 address: what DNS (and its IDNA encoding) accepts
        labels = host.split(".")
        if "" in labels or max(map(len, labels)) > 63:
            raise _BadRequest("bad host")
    return host, port


def _refused(address: str, own: frozenset[str]) -> bool:
    """Whether a rule for names (an exact name, a wildcard, ``*``) must not reach ``address``:
    a DNS answer, or a literal under ``*``.

    A name reaches only a global address that is not this host's: never loopback, link-local,
    multicast, unspecified, private, shared (CGNAT), unique-local or reserved addresses (this
    machine and its local network, where a DNS answer must not lead), nor any address of this
    host's interfaces (a service listening on all of them answers there as on loopback). Only a
    rule that names the address itself (or ``localhost``) reaches such an address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast or str(ip) in own


def _own_addresses() -> frozenset[str]:
    """Every address of this host's interfaces (its network namespace), read from ``/proc/net``:
    IPv4 from the routing table's local entries, IPv6 from ``if_inet6``. Empty where those cannot
    be read (loopback and the rest are still refused by kind)."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as table:
            last = ""
            for line in table:
                text = line.strip()
                if text.startswith("|-- "):
                    last = text[4:]
                elif text == "/32 host LOCAL" and last:
                    found.add(last)
    except (OSError, UnicodeDecodeError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as table:
            for line in table:
                digits = line.split(" ", 1)[0]
                if len(digits) == 32:
                    with contextlib.suppress(ValueError):
                        found.add(str(ipaddress.IPv6Address(int(digits, 16))))
    except (OSError, UnicodeDecodeError):
        pass
    return frozenset(found)


def _literal(host: str) -> str | None:
    """``host`` as the address to connect to when it is an IP address, else None."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _resolve(host: str, port: int, rule: HostRule) -> str:
    """The address to connect to: the first one ``getaddrinfo`` gives, each checked (``_refused``)
    when the rule names no address."""
    address = _literal(host)  # an address needs no lookup (nor a worker thread)
    if address is not None:
        addresses = [address]
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)  # in the worker: no thread hop
        addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise OSError("no address")
    if not rule.is_literal:
        own = _own_addresses()
        if any(_refused(a, own) for a in addresses):
            raise _Internal(host)
    return addresses[0]
