"""The transport seams: a launcher decides what command line runs a stdio server, an auth flow
authenticates to an HTTP server; both describe themselves in the record. Real servers only: the
SDK-less ``servers/raw.py`` over stdio, the SDK's ``servers/http_modern.py`` over Streamable HTTP."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import AsyncGenerator, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.gate.support import contract_from, new_store
from tests.mcp._util import RAW, contract_of, http_server, raw_server
from truss._clock import SystemClock
from truss._errors import ServerStartError
from truss.contract import Server
from truss.events import Event, ServerEvent
from truss.mcp import _procs
from truss.mcp.client import connect
from truss.mcp.launch import Launch, Report
from truss.runtime import Runtime
from truss.session import run_contract

pytestmark = pytest.mark.anyio

CLOCK = SystemClock()


@dataclass
class PrefixLauncher:
    """Runs every stdio server under ``env TRUSS_LAUNCHED_BY=prefix``, beside a pretend helper."""

    prefix: tuple[str, ...] = ("env", "TRUSS_LAUNCHED_BY=prefix")
    teardown: list[str] = field(default_factory=list[str])

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "prefix", "argv": list(self.prefix)}

    @asynccontextmanager
    async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
        report("helper_started", {"helper": "pretend-proxy"})
        try:
            yield Launch(self.prefix[0], (*self.prefix[1:], declared.command, *declared.args), declared.env,
                         declared.cwd)  # fmt: skip
        finally:
            self.teardown.append(server.name)
            report("helper_stopped", {"helper": "pretend-proxy"})


def _env_contract() -> str:
    return f"""
[contract]
name = "launched"
intent = "report the environment"
[[agent.steps]]
tool = "mcp:srv:env"
arguments = {{}}
[[mcp.servers]]
name = "srv"
command = {json.dumps(sys.executable)}
args = [{json.dumps(RAW)}, "env"]
allow_tools = ["env"]
connect_timeout = "20s"
[[done.checks]]
kind = "result_matches"
tool = "mcp:srv:env"
pointer = "/TRUSS_LAUNCHED_BY"
regex = "^prefix$"
"""


async def test_a_launcher_that_prefixes_the_command_runs_a_real_server_and_is_recorded(tmp_path: Path) -> None:
    launcher = PrefixLauncher()
    store, key = new_store(tmp_path)
    seen: list[Event] = []
    connector = functools.partial(connect, launcher=launcher)
    with anyio.fail_after(60):
        outcome = await run_contract(
            Runtime(
                store=store, key=key, clock=CLOCK, home=tmp_path, environ={}, connector=connector, events=[seen.append]
            ),
            contract_from(_env_contract()),
            session_id="s1",
        )
    assert outcome.status == "pass", outcome
    started = next(iter(store.read_session("s1")))
    assert started.body["servers"]["srv"]["launcher"] == {"kind": "prefix", "argv": ["env", "TRUSS_LAUNCHED_BY=prefix"]}
    reported = [(e.server, e.name, dict(e.attributes)) for e in seen if isinstance(e, ServerEvent)]
    assert reported == [
        ("srv", "helper_started", {"helper": "pretend-proxy"}),
        ("srv", "helper_stopped", {"helper": "pretend-proxy"}),
    ]
    assert {e.parent for e in seen if isinstance(e, ServerEvent)} == {None}
    assert {e.span for e in seen if isinstance(e, ServerEvent)} == {"s1@0"}
    assert launcher.teardown == ["srv"]


async def test_the_server_runs_through_the_launcher_and_has_ended_before_its_helpers_are_torn_down(
    tmp_path: Path,
) -> None:
    alive_at_teardown: list[bool] = []
    pids: dict[str, int] = {}

    class Watching(PrefixLauncher):
        @asynccontextmanager
        async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
            async with super().launch(server, declared, report) as actual:
                yield actual
            alive_at_teardown.append(_procs.group_alive(pids["srv"]))

    contract = contract_of(raw_server("srv", "env", allow=["env"]))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK, launcher=Watching()) as mounts:
            pids.update(mounts.pids())
            result = await mounts.call(mounts.tools["mcp:srv:env"], {}, timeout_s=10)
            status = mounts.servers["srv"]
    assert result.structured["TRUSS_LAUNCHED_BY"] == "prefix"
    assert status.launcher == {"kind": "prefix", "argv": ["env", "TRUSS_LAUNCHED_BY=prefix"]}
    assert status.to_json()["launcher"] == status.launcher
    assert alive_at_teardown == [False]


async def test_a_launcher_that_describes_itself_with_unrecordable_json_is_a_start_error(tmp_path: Path) -> None:
    class Huge(PrefixLauncher):
        def describe(self, server: Server) -> dict[str, Any]:
            return {"kind": "huge", "id": 2**60}  # beyond I-JSON's integers: RFC 8785 has no form for it

    contract = contract_of(raw_server("srv", "ok"))
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK, launcher=Huge()):
            pass
    assert (info.value.server, info.value.cause) == ("srv", "bad_launcher")


class BearerFlow(httpx2.Auth):
    """An auth flow that adds the bearer token to every request (what an OAuth provider does once
    it holds a token), and counts the requests it saw."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.requests = 0

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        self.requests += 1
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


@dataclass
class BearerAuth:
    flow_of: BearerFlow
    reports: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list[tuple[str, Mapping[str, Any]]])

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "test_bearer"}

    def flow(self, server: Server, report: Report) -> httpx2.Auth | None:
        report("flow_ready", {"server": server.name})
        return self.flow_of


async def test_an_auth_flow_that_adds_a_header_is_seen_by_a_real_http_server(tmp_path: Path, modern_http: str) -> None:
    contract = contract_of(http_server(modern_http))  # no headers: only the flow can get past the bearer check
    flow = BearerFlow("modern-token")
    events: list[tuple[str, str, Mapping[str, Any]]] = []

    def on_event(server: str, name: str, attributes: Mapping[str, Any]) -> None:
        events.append((server, name, attributes))

    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK, auth=BearerAuth(flow), on_event=on_event) as m:
            echo = await m.call(m.tools["mcp:web:echo"], {"text": "through the flow"}, timeout_s=10)
            status = m.servers["web"]
    assert echo.text == "through the flow"
    assert flow.requests >= 2  # the handshake or discovery, tools/list, the call
    assert status.auth == {"kind": "test_bearer"}
    assert events == [("web", "flow_ready", {"server": "web"})]
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):  # the default: the contract's headers only
            pass
    assert info.value.status == 401


async def test_static_headers_describe_the_header_names_never_their_values(tmp_path: Path, modern_http: str) -> None:
    headers = {"Authorization": {"secret_env": "MODERN", "format": "Bearer {}"}}
    contract = contract_of(http_server(modern_http, headers=headers))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, environ={"MODERN": "modern-token"}, clock=CLOCK) as m:
            status = m.servers["web"]
    assert status.auth == {"kind": "static_headers", "headers": ["Authorization"]}
    assert "modern-token" not in json.dumps(status.to_json())
