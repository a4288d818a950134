"""Two ``truss serve-mcp --transport http`` replicas on one PostgreSQL ledger, driven with the SDK client.

The same (principal, ``session_id``) sent to both replicas at once starts one run: the store makes
the claim atomic (``UNIQUE (session, seq)`` on the session's first entry), the replica that lost
it answers with the other's session; a status poll on either answers; a caller waiting on the
replica that does not drive the run gets the run's verdict when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import anyio
import pytest

from tests.serve.conftest import TOKEN_A, TOKEN_B, HttpServer, Site, structured
from tests.serve.test_serve_http import http_client
from truss._clock import SystemClock
from truss.ledger.stores import open_store

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
