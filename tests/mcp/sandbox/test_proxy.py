"""The egress proxy over real sockets (a Unix socket in, loopback TCP out), without a sandbox around it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests.mcp.sandbox._util import answering_listener
from truss._clock import SystemClock
from truss.mcp.sandbox import EgressEvent, EgressProxy, EgressSummary, SandboxEvent, parse_host_rule
from truss.mcp.sandbox._proxy import MAX_TUNNELS

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running_proxy(
    tmp_path: Path, rules: list[str], events: list[SandboxEvent], **options: int
) -> AsyncGenerator[tuple[Path, EgressProxy]]:
    path = tmp_path / "proxy.sock"
    proxy = EgressProxy("srv", [parse_host_rule(r) for r in rules], SystemClock(), events.append, **options)
    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(proxy.serve, listener)
        try:
            yield path, proxy
        finally:
            tg.cancel_scope.cancel()
    await proxy.flush()


async def ask(path: Path, request: bytes, then: bytes = b"") -> bytes:
    """Send ``request`` to the proxy, then ``then`` once it answers; everything it sends back."""
    with anyio.fail_after(10):
        async with await anyio.connect_unix(path) as stream:
            await stream.send(request)
            answer = await stream.receive()
            if then:
                await stream.send(then)
                await stream.send_eof()
            try:
                async for chunk in stream:
                    answer += chunk
            except (anyio.BrokenResourceError, OSError):
                pass
            return answer


async def settle(events: list[SandboxEvent], count: int) -> None:
    with anyio.fail_after(10):
        while len(events) < count:  # noqa: ASYNC110 - the proxy reports from its own task
            await anyio.sleep(0.01)


async def test_a_connect_to_an_allowed_host_tunnels_and_is_reported_with_its_byte_counts(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    async with answering_listener(b"pong\n") as port, running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _):
        answer = await ask(p, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), b"ping\n")
        await settle(events, 1)
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\npong\n"
    [event] = events
    assert isinstance(event, EgressEvent)
    assert event == EgressEvent("srv", "127.0.0.1", port, "allowed", None, 5, 5, event.duration_ms, "CONNECT")


async def test_a_host_not_allowed_is_refused_with_403_reported_and_never_contacted(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    contacted: list[bytes] = []
    answer = b""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = int(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def note(stream: anyio.abc.SocketStream) -> None:
        contacted.append(b"connection")
        await stream.aclose()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, note)
        async with running_proxy(tmp_path, ["api.github.com:443"], events) as (p, _):
            answer = await ask(p, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            await settle(events, 1)
        tg.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert contacted == []
    event = events[0]
    assert isinstance(event, EgressEvent)
    assert (event.host, event.port, event.decision, event.reason) == ("127.0.0.1", port, "refused", "not_allowed")


async def test_plain_http_is_sent_in_origin_form_with_connection_close_and_no_proxy_headers(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    seen: list[bytes] = []
    answer = b""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = int(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def origin(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            seen.append(data)
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, origin)
        async with running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _):
            request = (
                f"GET http://127.0.0.1:{port}/a/b?c=d HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n"
            )
            answer = await ask(p, request.encode())
            await settle(events, 1)
        tg.cancel_scope.cancel()
    assert answer.endswith(b"\r\n\r\nok")
    head = seen[0].decode()
    assert head.startswith("GET /a/b?c=d HTTP/1.1\r\n")
    assert "Connection: close\r\n" in head
    assert "Proxy-" not in head and "keep-alive" not in head
    event = events[0]
    assert isinstance(event, EgressEvent) and event.method == "GET" and event.decision == "allowed"


async def test_a_wildcard_rule_never_reaches_an_internal_address_on_any_attempt(tmp_path: Path) -> None:
    # The second attempt is decided from what the proxy remembers of the first (host, port).
    events: list[SandboxEvent] = []
    async with (
        answering_listener(b"secret service\n") as port,
        running_proxy(tmp_path, [f"*:{port}"], events) as (p, _),
    ):
        answers = [await ask(p, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()) for _ in range(2)]
        await settle(events, 2)
    assert all(answer.startswith(b"HTTP/1.1 403 ") for answer in answers)
    assert [e.reason for e in events if isinstance(e, EgressEvent)] == ["resolves_to_internal"] * 2


def answers_from_dns(monkeypatch: pytest.MonkeyPatch, name: str, address: str) -> None:
    """``name`` resolves to ``address`` (the DNS answer is the untrusted input here); other names as usual."""
    real = socket.getaddrinfo

    def fake(host: object, port: object, *args: object, **kwargs: object) -> object:
        if host == name:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, int(str(port))))]
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def this_hosts_own_address() -> str:
    """The address this host sends from on its default route: one of its own, not loopback
    (a UDP socket's connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.99", 9))
        except OSError as exc:
            pytest.fail(f"this test needs a machine with a default route: {exc}")
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), address
    return address


async def assert_refused_as_internal(tmp_path: Path, rule: str, target: str) -> None:
    """``CONNECT target`` under ``rule`` gets 403 and is reported as ``resolves_to_internal``."""
    events: list[SandboxEvent] = []
    async with running_proxy(tmp_path, [rule], events) as (p, _):
        answer = await ask(p, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        await settle(events, 1)
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert isinstance(events[0], EgressEvent) and events[0].reason == "resolves_to_internal"


async def test_a_star_rule_never_reaches_a_private_address(tmp_path: Path) -> None:
    await assert_refused_as_internal(tmp_path, "*:8443", "10.255.255.1:8443")


@pytest.mark.parametrize("rule", ["*.corp.test:8443", "api.corp.test:8443", "*:8443"])
async def test_a_name_never_reaches_a_private_address_its_dns_answer_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    answers_from_dns(monkeypatch, "api.corp.test", "10.1.2.3")
    await assert_refused_as_internal(tmp_path, rule, "api.corp.test:8443")


async def test_a_name_rule_never_reaches_an_address_of_this_host_other_than_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service listening on every interface answers on the host's own address as on loopback.
    answers_from_dns(monkeypatch, "intranet.test", this_hosts_own_address())
    await assert_refused_as_internal(tmp_path, "intranet.test:8443", "intranet.test:8443")


@pytest.mark.parametrize(
    "request_head",
    [
        pytest.param(b"GET /relative HTTP/1.1\r\n\r\n", id="origin_form"),
        pytest.param(b"CONNECT api.github.com HTTP/1.1\r\n\r\n", id="connect_without_port"),
        pytest.param(b"CONNECT user@api.github.com:443 HTTP/1.1\r\n\r\n", id="user_information"),
        pytest.param(b"GET https://api.github.com/ HTTP/1.1\r\n\r\n", id="https_in_absolute_form"),
        pytest.param(b"HELLO\r\n\r\n", id="not_http"),
        pytest.param(b"CONNECT evil\\host:443 HTTP/1.1\r\n\r\n", id="backslash_in_host"),
        pytest.param(b"CONNECT evil\thost:443 HTTP/1.1\r\n\r\n", id="tab_in_host"),
        pytest.param("CONNECT bücher.example:443 HTTP/1.1\r\n\r\n".encode("latin-1"), id="non_ascii_host"),
        pytest.param(b"CONNECT " + b"a" * 64 + b".example:443 HTTP/1.1\r\n\r\n", id="label_over_63"),
        pytest.param(b"CONNECT a..example:443 HTTP/1.1\r\n\r\n", id="empty_label"),
        pytest.param(b"GET http://" + b"a" * 20000 + b"/ HTTP/1.1\r\n\r\n", id="oversized_head"),
    ],
)
async def test_a_malformed_request_gets_400_and_is_reported_as_refused(tmp_path: Path, request_head: bytes) -> None:
    events: list[SandboxEvent] = []
    async with running_proxy(tmp_path, ["api.github.com:443"], events) as (p, _):
        answer = await ask(p, request_head)
        await settle(events, 1)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert isinstance(events[0], EgressEvent) and events[0].reason == "bad_request"


async def test_an_allowed_host_that_cannot_be_reached_is_reported_as_failed(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    async with answering_listener(b"") as port:
        pass  # the port is closed again: nothing listens there now
    async with running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _):
        answer = await ask(p, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        await settle(events, 1)
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert isinstance(events[0], EgressEvent) and (events[0].decision, events[0].reason) == ("failed", "connect_failed")


async def test_past_the_event_bound_a_flood_is_summarised_per_host_and_decision(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    async with running_proxy(tmp_path, ["api.github.com:443"], events, max_events=3) as (p, proxy):
        for _ in range(10):
            await ask(p, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")
        await settle(events, 3)
        assert proxy.reported == 3
    assert [type(e) for e in events] == [EgressEvent] * 3 + [EgressSummary]
    assert events[3] == EgressSummary("srv", "evil.example", 443, "refused", 7, 0, 0)


async def test_connections_past_the_tunnel_bound_are_refused_as_busy(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    async with (
        answering_listener(b"") as port,
        running_proxy(tmp_path, [f"127.0.0.1:{port}"], events, max_tunnels=1) as (
            p,
            _,
        ),
    ):
        with anyio.fail_after(10):
            async with await anyio.connect_unix(p) as first:
                await first.send(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
                assert (await first.receive()).startswith(b"HTTP/1.1 200")
                answer = await ask(p, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        await settle(events, 2)
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert any(isinstance(e, EgressEvent) and e.reason == "busy" for e in events)


async def test_bytes_a_client_sends_while_its_tunnel_opens_reach_the_upstream_in_order(tmp_path: Path) -> None:
    # The client does not wait for "200 Connection established": what it streams meanwhile arrives
    # while the tunnel's two sides are being set up, and must still reach the upstream byte for byte.
    events: list[SandboxEvent] = []
    payload = b"".join(i.to_bytes(4, "big") for i in range(1 << 20))  # 4 MiB, every offset distinct
    received = bytearray()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = int(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def origin(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while len(received) < len(payload):
                    received.extend(await stream.receive())

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, origin)
        async with running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _):
            with anyio.fail_after(20):
                async with await anyio.connect_unix(p) as stream:
                    head = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
                    await stream.send(head + payload[:1000])
                    for start in range(1000, len(payload), 64 * 1024):
                        await stream.send(payload[start : start + 64 * 1024])
                    await stream.send_eof()
                    while len(received) < len(payload):  # noqa: ASYNC110 - the origin reads in its own task
                        await anyio.sleep(0.01)
            await settle(events, 1)
        tg.cancel_scope.cancel()
    assert len(received) == len(payload)
    assert bytes(received) == payload


def egress_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "truss-egress")


async def no_egress_threads_left() -> None:
    with anyio.fail_after(10):
        while egress_threads():  # noqa: ASYNC110 - the workers end in their own threads
            await anyio.sleep(0.01)


async def test_past_64_open_tunnels_the_next_connection_is_refused_as_busy_and_every_one_is_reported(
    tmp_path: Path,
) -> None:
    events: list[SandboxEvent] = []
    assert MAX_TUNNELS == 64
    async with (
        answering_listener(b"") as port,
        running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _),
        contextlib.AsyncExitStack() as stack,
    ):
        head = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()
        with anyio.fail_after(30):
            for _ in range(MAX_TUNNELS):
                stream = await stack.enter_async_context(await anyio.connect_unix(p))
                await stream.send(head)
                assert (await stream.receive()).startswith(b"HTTP/1.1 200")
            answer = await ask(p, head)
        await settle(events, 1)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert [e.reason for e in events if isinstance(e, EgressEvent)] == ["busy"]
        await stack.aclose()  # the 64 tunnels end: each is reported once, with its byte counts
        await settle(events, MAX_TUNNELS + 1)
    await no_egress_threads_left()
    tunnels = [e for e in events if isinstance(e, EgressEvent) and e.decision == "allowed"]
    assert len(tunnels) == MAX_TUNNELS
    assert all(e.reason is None and e.bytes_down == 0 for e in tunnels)


async def test_stopping_the_proxy_ends_an_open_tunnel_reports_its_bytes_and_leaves_no_worker_thread(
    tmp_path: Path,
) -> None:
    events: list[SandboxEvent] = []
    async with answering_listener(b"pong\n") as port:
        stream: anyio.abc.SocketStream | None = None
        async with running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _):
            with anyio.fail_after(10):
                stream = await anyio.connect_unix(p)
                await stream.send(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping\n".encode())
                answer = b""
                while not answer.endswith(b"pong\n"):
                    answer += await stream.receive()
        # The proxy stopped with the tunnel still open: it is cut off and reported as it stood.
        assert stream is not None
        with anyio.fail_after(10), contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            while await stream.receive():
                pass
        await stream.aclose()
    await no_egress_threads_left()
    [event] = events
    assert isinstance(event, EgressEvent)
    assert (event.decision, event.bytes_up, event.bytes_down) == ("allowed", 5, 5)


async def open_tunnels(p: Path, port: int, count: int, stack: contextlib.AsyncExitStack) -> None:
    """``count`` tunnels to the answering listener, each past its answer and held open in ``stack``."""
    with anyio.fail_after(30):
        for _ in range(count):
            stream = await stack.enter_async_context(await anyio.connect_unix(p))
            await stream.send(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping\n".encode())
            answer = b""
            while not answer.endswith(b"pong\n"):
                answer += await stream.receive()


async def test_tunnels_that_end_together_wake_the_event_loop_once_per_batch_and_each_is_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[SandboxEvent] = []
    loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()
    wakeups: list[object] = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(callback: Callable[..., object], *args: object) -> asyncio.Handle:
        if threading.get_ident() != loop_thread:
            wakeups.append(callback)
        return call_soon_threadsafe(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    async with (
        answering_listener(b"pong\n") as port,
        running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _),
        contextlib.AsyncExitStack() as stack,
    ):
        await open_tunnels(p, port, 20, stack)
        before = len(wakeups)
        await stack.aclose()  # all 20 end within a few ms of each other
        await settle(events, 20)
        woken = len(wakeups) - before
    assert 1 <= woken <= 5  # one per tunnel without the batching
    assert [(e.decision, e.bytes_up, e.bytes_down) for e in events if isinstance(e, EgressEvent)] == [
        ("allowed", 5, 5)
    ] * 20


async def test_tunnel_ends_held_for_a_batch_are_all_reported_when_the_proxy_stops_first(tmp_path: Path) -> None:
    events: list[SandboxEvent] = []
    async with (
        answering_listener(b"pong\n") as port,
        running_proxy(tmp_path, [f"127.0.0.1:{port}"], events) as (p, _),
        contextlib.AsyncExitStack() as stack,
    ):
        await open_tunnels(p, port, 20, stack)
        await stack.aclose()
        # No wait: the proxy stops while the ends of most tunnels are still held for the batch.
    assert len(events) == 20
    assert all(isinstance(e, EgressEvent) and e.decision == "allowed" and e.bytes_up == 5 for e in events)
