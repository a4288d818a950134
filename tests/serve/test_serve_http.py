"""serve-mcp over Streamable HTTP on 127.0.0.1: bearer tokens, principals, both eras, bounds,
concurrency and clients that go away mid-run."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager, closing
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.serve.conftest import TOKEN_A, TOKEN_B, HttpServer, Site, error_of, structured
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.stores import open_store
from truss.ledger.verification import verify_ledger
from truss.mcp._serve_core import Principal, TokenTable
from truss.mcp._serve_http import _BearerGate  # pyright: ignore[reportPrivateUsage]

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@asynccontextmanager
async def http_client(url: str, token: str | None, *, mode: str = "auto") -> AsyncGenerator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=120.0)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, read_timeout_seconds=90, cache=None) as client,
    ):
        yield client


def _initialize() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }


async def test_http_without_a_valid_bearer_token_gets_401_and_reaches_nothing(http_server: HttpServer) -> None:
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=10) as http:
            headers = {"Accept": "application/json, text/event-stream"}
            for auth in (None, "Bearer wrong-token", "Basic " + TOKEN_A, "Bearer " + TOKEN_A[:-1]):
                sent = dict(headers) | ({"Authorization": auth} if auth else {})
                response = await http.post(http_server.url, json=_initialize(), headers=sent)
                assert response.status_code == 401, auth
                assert response.headers["www-authenticate"].startswith("Bearer")
            ok = await http.post(
                http_server.url, json=_initialize(), headers=headers | {"Authorization": f"Bearer {TOKEN_A}"}
            )
            assert ok.status_code == 200


async def _websocket_handshake(url: str, token: str | None) -> tuple[str, str]:
    """A raw WebSocket opening handshake to ``url``: the status line and the headers of the answer."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    head = (
        f"GET {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + (f"Authorization: Bearer {token}\r\n" if token is not None else "")
        + "\r\n"
    )
    async with await anyio.connect_tcp(where.hostname, where.port) as stream:
        await stream.send(head.encode())
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            try:
                data += await stream.receive()
            except anyio.EndOfStream:
                break
    status, _, headers = data.partition(b"\r\n\r\n")[0].decode("latin-1").partition("\r\n")
    return status, headers.lower()


async def test_a_websocket_handshake_without_a_valid_bearer_token_gets_the_gates_401(http_server: HttpServer) -> None:
    # With a WebSocket library installed (uvicorn[standard] brings one) uvicorn hands the app a
    # "websocket" scope, which the gate used to pass on unauthenticated (the app then closed it: 403).
    with anyio.fail_after(30):
        for token in (None, "wrong-token"):
            status, headers = await _websocket_handshake(http_server.url, token)
            assert status.split(" ")[1] == "401", status
            assert 'www-authenticate: bearer error="invalid_token"' in headers


async def test_the_bearer_gate_closes_a_websocket_without_a_token_and_passes_on_no_other_scope() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    principal = Principal(tenant="acme", user="alice")
    gate = _BearerGate(app, TokenTable([(hashlib.sha256(TOKEN_A.encode()).digest(), principal)]))
    with anyio.fail_after(10):
        await gate({"type": "websocket", "headers": [], "extensions": {}}, receive, send)
        assert sent == [{"type": "websocket.close", "code": 1008}] and seen == []
        await gate(
            {"type": "webtransport", "headers": [(b"authorization", f"Bearer {TOKEN_A}".encode())]}, receive, send
        )
        assert seen == []
        await gate({"type": "websocket", "headers": [(b"authorization", f"Bearer {TOKEN_A}".encode())]}, receive, send)
        await gate({"type": "lifespan"}, receive, send)
        assert seen == ["websocket", "lifespan"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_delegated_run_over_http_passes_in_both_eras(http_server: HttpServer, mode: str) -> None:
    with anyio.fail_after(90):
        async with http_client(http_server.url, TOKEN_A, mode=mode) as client:
            assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            result = await client.call_tool("truss_run_contract", {"contract": "hello"})
            answer = structured(result)
            assert not result.is_error and answer["status"] == "pass"
            status = structured(await client.call_tool("truss_contract_status", {"session": answer["session"]}))
            assert status["verification"]["ok"] is True


async def test_principals_over_http_see_only_their_own_sessions(http_server: HttpServer, serve_site: Site) -> None:
    with anyio.fail_after(90):
        async with http_client(http_server.url, TOKEN_A) as alice, http_client(http_server.url, TOKEN_B) as bob:
            mine = structured(await alice.call_tool("truss_run_contract", {"contract": "hello"}))
            for tool in ("truss_contract_status", "truss_ledger_verdict", "truss_ledger_export"):
                theirs = await bob.call_tool(tool, {"session": mine["session"]})
                assert error_of(theirs)["kind"] == "not_found"
                own = await alice.call_tool(tool, {"session": mine["session"]})
                assert not own.is_error
    with closing(sqlite3.connect(serve_site.home / "ledger.db")) as db, db:
        principals = [row[0] for row in db.execute("SELECT principal FROM sessions")]
    assert len(principals) == 1 and "alice" in str(principals[0])


async def test_an_oversized_http_request_is_refused_before_it_is_parsed(http_server: HttpServer) -> None:
    body = _initialize()
    body["params"]["padding"] = "x" * 1_100_000
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=10) as http:
            response = await http.post(
                http_server.url,
                json=body,
                headers={"Authorization": f"Bearer {TOKEN_A}", "Accept": "application/json, text/event-stream"},
            )
    assert response.status_code == 413


async def test_fifty_concurrent_runs_with_a_limit_of_four_run_four_and_turn_the_rest_away(
    http_server: HttpServer, serve_site: Site
) -> None:
    flag = serve_site.flag("fifty")
    results: list[Any] = []
    busy_all_back = anyio.Event()

    async def one(client: Client, i: int) -> None:
        result = await client.call_tool("truss_run_contract", {"contract": "gated", "params": {"flag": str(flag)}})
        results.append(result)
        if sum(1 for r in results if r.is_error) == 46:
            busy_all_back.set()

    with anyio.fail_after(120):
        async with http_client(http_server.url, TOKEN_A) as client, anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, client, i)
            await busy_all_back.wait()
            flag.touch()

    busy = [error_of(r) for r in results if r.is_error]
    done = [structured(r) for r in results if not r.is_error]
    assert len(busy) == 46 and all(e["kind"] == "busy" and e["retryable"] is True for e in busy)
    assert len(done) == 4 and all(a["status"] == "pass" for a in done)
    key = IdentityKey.load(serve_site.home / "identity.key")
    store = open_store(serve_site.home / "ledger.db", key=None, clock=SystemClock())
    try:
        sessions = store.sessions()
        assert sorted(s.id for s in sessions) == sorted(a["session"] for a in done)
        assert all(s.ended and s.status == "pass" for s in sessions)
        assert verify_ledger(store, TrustedKeys([key.verifier])).ok
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_that_disconnects_mid_run_finds_the_run_completed(
    http_server: HttpServer, serve_site: Site, mode: str
) -> None:
    flag = serve_site.flag(f"disconnect-{mode}")
    started = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    call = {"contract": "gated", "params": {"flag": str(flag)}, "session_id": f"dc-{mode}"}
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:

            async def first_client() -> None:
                async with http_client(http_server.url, TOKEN_A, mode=mode) as client:
                    await client.call_tool("truss_run_contract", call, progress_callback=on_progress)

            tg.start_soon(first_client)
            await started.wait()
            tg.cancel_scope.cancel()  # the client goes away while its run waits mid-call
        flag.touch()
        async with http_client(http_server.url, TOKEN_A, mode=mode) as client:
            answer = structured(await client.call_tool("truss_run_contract", call))
            status = structured(await client.call_tool("truss_contract_status", {"session": answer["session"]}))
    assert answer["status"] == "pass"
    assert status["status"] == "pass" and status["verification"]["ok"] is True


@pytest.mark.parametrize(("sig", "detached"), [("SIGTERM", True), ("SIGINT", False), ("SIGTERM", False)])
async def test_a_stop_signal_records_http_runs_in_flight_as_interrupted_and_a_later_server_resumes_them(
    serve_site: Site, sig: str, detached: bool
) -> None:
    # As over stdio: SIGTERM or SIGINT stops the server, and a run still in progress (detached, or
    # a caller's request still open) records itself interrupted; a new server resumes it by id.
    flag = serve_site.flag(f"stop-{sig}-{detached}")
    session = f"stop-{sig.lower()}-{'detached' if detached else 'waiting'}"
    call = {"contract": "gated", "params": {"flag": str(flag)}, "session_id": session}
    server = HttpServer(serve_site, "--tokens", str(serve_site.tokens))
    answered: list[Any] = []
    try:
        with anyio.fail_after(120):
            started = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                started.set()

            async with http_client(server.url, TOKEN_A) as client, anyio.create_task_group() as tg:
                if detached:
                    handle = structured(await client.call_tool("truss_run_contract", {**call, "async": True}))
                    while not structured(
                        await client.call_tool("truss_contract_status", {"session": handle["session"]})
                    ).get("progress"):
                        pass  # each round trip is a request: until the run has reached its blocking call
                else:

                    async def waiting_caller() -> None:
                        try:
                            answered.append(
                                await client.call_tool("truss_run_contract", call, progress_callback=on_progress)
                            )
                        except Exception as exc:  # the server may go before it answers: the ledger says what happened
                            answered.append(exc)

                    tg.start_soon(waiting_caller)
                    await started.wait()
                server.proc.send_signal(getattr(signal, sig))
                code = await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=60))
                tg.cancel_scope.cancel()
    finally:
        code, _ = server.stop()
    log = "".join(server.lines)
    assert code == 0 and "Traceback" not in log, log
    assert "interrupting 1 run" in log, log
    with closing(sqlite3.connect(serve_site.home / "ledger.db")) as db, db:
        (stored,) = [row[0] for row in db.execute("SELECT id FROM sessions")]  # the caller's id, scoped to them
        kinds = [row[0] for row in db.execute("SELECT kind FROM entries WHERE session = ? ORDER BY seq", (stored,))]
    assert kinds[-1] == "session_suspended", kinds
    if not detached:  # the caller still waiting was answered before the server went
        (answer,) = answered
        assert not isinstance(answer, Exception), answer
        assert structured(answer)["status"] == "interrupted"

    again = HttpServer(serve_site, "--tokens", str(serve_site.tokens))
    try:
        with anyio.fail_after(120):
            async with http_client(again.url, TOKEN_A) as client:
                status = structured(await client.call_tool("truss_contract_status", {"session": stored}))
                assert status["status"] == "interrupted"
                flag.touch()
                resumed = structured(await client.call_tool("truss_run_contract", call))
    finally:
        again.stop()
    assert resumed["session"] == stored and resumed["status"] == "pass"


_ACCEPT = {"Accept": "application/json, text/event-stream"}
_VERSION = "2025-11-25"


async def _open_session(http: httpx2.AsyncClient, url: str, token: str) -> dict[str, str]:
    """The headers of a fresh, initialized 2025-11-25 session of ``token``'s principal."""
    headers = _ACCEPT | {"Authorization": f"Bearer {token}"}
    opened = await http.post(url, json=_initialize(), headers=headers)
    assert opened.status_code == 200
    headers |= {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": _VERSION}
    done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert done.status_code == 202
    return headers


def _event_ids(sse: str) -> list[str]:
    return [line[4:] for line in sse.splitlines() if line.startswith("id: ")]


async def test_another_principal_cannot_use_or_end_an_http_session_it_did_not_open(http_server: HttpServer) -> None:
    # Regression: a session was bound to nobody, so any valid token could send requests into
    # another principal's MCP session, or DELETE it, given its session id.
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    with anyio.fail_after(60):
        async with httpx2.AsyncClient(timeout=30) as http:
            alice = await _open_session(http, http_server.url, TOKEN_A)
            bob_in_alices = alice | {"Authorization": f"Bearer {TOKEN_B}"}
            assert (await http.post(http_server.url, json=listing, headers=bob_in_alices)).status_code == 404
            assert (await http.delete(http_server.url, headers=bob_in_alices)).status_code == 404
            mine = await http.post(http_server.url, json=listing, headers=alice)
            assert mine.status_code == 200 and "truss_run_contract" in mine.text


async def test_resuming_an_sse_stream_replays_only_the_callers_own_events(http_server: HttpServer) -> None:
    # Regression: the replay buffer is shared by every session and keyed by the SSE stream's id,
    # which is the JSON-RPC request id; a caller resuming its stream with Last-Event-ID was sent
    # every later event on any session whose request had the same id: other principals' answers.
    with anyio.fail_after(90):
        async with httpx2.AsyncClient(timeout=30) as http:
            bob = await _open_session(http, http_server.url, TOKEN_B)
            alice = await _open_session(http, http_server.url, TOKEN_A)
            listed = await http.post(http_server.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                     headers=bob)  # fmt: skip
            first = _event_ids(listed.text)[0]
            run = {"name": "truss_run_contract", "arguments": {"contract": "hello"}}
            ran = await http.post(http_server.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                                         "params": run}, headers=alice)  # fmt: skip
            alices_session = json.loads(ran.text.split("data: ")[-1])["result"]["structuredContent"]["session"]
            replayed = ""
            async with http.stream("GET", http_server.url, headers=bob | {"last-event-id": first}) as stream:
                assert stream.status_code == 200
                async for chunk in stream.aiter_text():
                    replayed += chunk
                    if "retry: " in replayed:  # the resumed stream's priming event: the replay is over
                        break
    assert '"tools"' in replayed  # bob's own answer after his event is replayed
    assert alices_session not in replayed
