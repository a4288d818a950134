"""Two ``truss serve-mcp --transport http`` replicas on one PostgreSQL ledger, driven with the SDK client.

The same (principal, ``session_id``) sent to both replicas at once starts one run: the store makes
the claim atomic (``UNIQUE (session, seq)`` on the session's first entry), the replica that lost
it answers with the other's session; a status poll on either answers; a caller waiting on the
replica that does not drive the run gets the run's verdict when it ends.

Where the property lives in one replica (its run slots), two in-process ``ServeApp``s over one
SQLite ledger stand in for two replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.serve.conftest import TOKEN_A, TOKEN_B, HttpServer, Site, error_of, structured
from tests.serve.test_serve_http import http_client
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.mcp._serve_backend import LedgerBackend
from truss.mcp._serve_core import Principal
from truss.mcp.server import RunAnswer, ServeConfig, ServeLimits, serve_app
from truss.runtime import Runtime

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def replicas(serve_site: Site, postgres_url: str) -> Iterator[tuple[HttpServer, HttpServer]]:
    serve_site.env["TRUSS_DB"] = postgres_url
    started: list[HttpServer] = []
    try:
        for _ in range(2):
            started.append(HttpServer(serve_site, "--tokens", str(serve_site.tokens), "--max-concurrent-runs", "2"))
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _kinds(url: str, session: str) -> list[str]:
    with closing(open_store(url, key=None, clock=SystemClock(), create=False)) as store:
        return [e.kind for e in store.read_session(session)]


async def test_the_same_session_id_sent_to_two_replicas_at_once_starts_one_run(
    replicas: tuple[HttpServer, HttpServer], serve_site: Site, postgres_url: str
) -> None:
    one, two = replicas
    flag = serve_site.flag("replicas")
    call = {"contract": "gated", "params": {"flag": str(flag)}, "session_id": "job-1", "async": True}
    answers: list[dict[str, Any]] = []
    with anyio.fail_after(120):
        async with http_client(one.url, TOKEN_A) as a, http_client(two.url, TOKEN_A) as b:

            async def send(client: Any) -> None:
                answers.append(structured(await client.call_tool("truss_run_contract", call)))

            async with anyio.create_task_group() as tg:  # both at once: the store picks one
                tg.start_soon(send, a)
                tg.start_soon(send, b)
            assert len({x["session"] for x in answers}) == 1, answers
            session = answers[0]["session"]
            assert all(x["status"] == "running" for x in answers), answers
            for client in (a, b):  # a status poll on either replica answers
                status = structured(await client.call_tool("truss_contract_status", {"session": session}))
                assert status["session"] == session and status["status"] == "running", status

            waiting = {"contract": "gated", "params": {"flag": str(flag)}, "session_id": "job-1"}
            finals: list[dict[str, Any]] = []

            async def wait_on(client: Any) -> None:
                finals.append(structured(await client.call_tool("truss_run_contract", waiting)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_on, a)
                tg.start_soon(wait_on, b)
                flag.touch()
            assert [f["status"] for f in finals] == ["pass", "pass"], finals
            assert {f["session"] for f in finals} == {session}

            for client in (a, b):  # and after it: either replica answers from the shared ledger
                status = structured(await client.call_tool("truss_contract_status", {"session": session}))
                assert status["status"] == "pass" and status["verification"]["ok"] is True, status
                assert status["counts"]["tool_calls"] == 1
        async with http_client(two.url, TOKEN_B) as bob:  # another principal's same key is its own session
            theirs = await bob.call_tool("truss_contract_status", {"session": session})
            assert theirs.is_error

    kinds = _kinds(postgres_url, session)
    assert kinds.count("session_started") == 1
    assert kinds.count("mcp_tool_intent") == 1, kinds  # one run called the tool, once


class _Watched(LedgerBackend):
    """The ledger backend, telling when it begins to follow a run another replica drives."""

    following: anyio.Event

    async def follow(self, session_id: str, *, stop: anyio.Event | None = None) -> RunAnswer:
        self.following.set()
        return await super().follow(session_id, stop=stop)


async def test_a_call_waiting_on_a_run_another_replica_drives_takes_no_run_slot(serve_site: Site) -> None:
    # Regression: following another replica's run took one of this process's run slots, so a
    # replica busy with its own runs answered "busy" to a caller that only wanted to wait.
    flag = serve_site.flag("follow")
    gated = {"contract": "gated", "params": {"flag": str(flag)}}
    key = IdentityKey.load(serve_site.home / "identity.key")
    clock = SystemClock()
    store = open_store(serve_site.home / "ledger.db", key=key, clock=clock)
    backend = _Watched(Runtime(store=store, key=key, clock=clock, home=serve_site.home, environ=serve_site.env))
    backend.following = anyio.Event()
    config = ServeConfig(contracts_dir=serve_site.contracts, home=serve_site.home, backend=backend, clock=clock,
                         limits=ServeLimits(max_concurrent_runs=1))  # fmt: skip
    principal = Principal("acme", "alice")
    try:
        async with (
            serve_app(config, lambda ctx: principal) as one,
            serve_app(config, lambda ctx: principal) as two,
            Client(one.server, cache=None) as a,
            Client(two.server, cache=None) as b,
        ):
            with anyio.fail_after(120):
                theirs = structured(
                    await a.call_tool("truss_run_contract", {**gated, "session_id": "j", "async": True})
                )
                ours = structured(await b.call_tool("truss_run_contract", {**gated, "async": True}))
                assert theirs["status"] == ours["status"] == "running"
                while True:  # until replica one has recorded the session's start
                    status = structured(await a.call_tool("truss_contract_status", {"session": theirs["session"]}))
                    if status["head"]:
                        break
                    await anyio.sleep(0.05)
                full = error_of(await b.call_tool("truss_run_contract", {**gated, "async": True}))
                assert full["kind"] == "busy"  # replica two's one slot is its own run's
                answers: list[Any] = []

                async def wait_on() -> None:
                    answers.append(await b.call_tool("truss_run_contract", {**gated, "session_id": "j"}))
                    backend.following.set()  # answered without following: let the test see it

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait_on)
                    await backend.following.wait()
                    assert two.active_runs == 1  # its own run; the follower holds no slot
                    flag.touch()
                assert not answers[0].is_error, answers  # it was "busy"
                final = structured(answers[0])
                assert final["session"] == theirs["session"] and final["status"] == "pass", final
    finally:
        store.close()
