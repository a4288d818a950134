"""A server's reports (a sandbox's egress decisions, a launcher's notes) reach the collector as span
events with the known secrets scrubbed out, as the ledger's ``sandbox_egress`` entries have them.

An in-process run of a real stdio server (``servers/raw.py``) whose launcher reports what a hostile
sandboxed server could make its proxy see: its own secret as the host name it asks for (which the
proxy lower-cases) and as the method of its request line. The spans go to a real OTLP receiver.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import contract_from, new_store
from tests.mcp._util import RAW
from tests.telemetry.conftest import require_otel_extra
from truss._clock import SystemClock
from truss.contract import Server
from truss.mcp.client import connect
from truss.mcp.launch import Launch, Report
from truss.runtime import Runtime
from truss.session import run_contract
from truss.telemetry import Telemetry, TelemetrySettings

require_otel_extra()
from tests.telemetry.receiver import Receiver  # noqa: E402 - after the check that the extra is here

pytestmark = pytest.mark.anyio

SECRET = "Canary-Egress-7Q2x9dW4"  # mixed case: the proxy records a host name lower-cased


class HostileEgress:
    """Runs the server as declared and reports, as a sandbox's proxy would, what the server asked for."""

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "hostile-egress"}

    @asynccontextmanager
    async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
        report("sandbox_egress", {"host": f"{SECRET.lower()}.attacker.example", "port": 443, "decision": "refused",
                                  "reason": "not_allowed", "method": "CONNECT", "bytes_up": 0, "bytes_down": 0,
                                  "duration_ms": 0})  # fmt: skip
        report("sandbox_egress", {"host": "attacker.example", "port": 80, "decision": "refused",
                                  "reason": "not_allowed", "method": f"GET{SECRET}", "bytes_up": 0, "bytes_down": 0,
                                  "duration_ms": 0})  # fmt: skip
        yield declared


CONTRACT = f"""
[contract]
name = "reports"
intent = "report the environment"
[[agent.steps]]
tool = "mcp:srv:env"
arguments = {{}}
[[mcp.servers]]
name = "srv"
command = {json.dumps(sys.executable)}
args = [{json.dumps(RAW)}, "env"]
allow_tools = ["env"]
secret_env = ["EGRESS_TOKEN"]
connect_timeout = "20s"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:env"
"""


async def test_a_secret_a_server_puts_in_its_egress_reports_reaches_neither_the_ledger_nor_the_collector(
    tmp_path: Path, otlp: Receiver
) -> None:
    store, key = new_store(tmp_path)
    settings = TelemetrySettings(traces_url=f"{otlp.endpoint}/v1/traces", schedule_delay_s=60)
    telemetry = Telemetry(settings, origin=str(store.origin), clock=SystemClock())
    environ = {"EGRESS_TOKEN": SECRET}
    connector = functools.partial(connect, launcher=HostileEgress())
    runtime = Runtime(store=store, key=key, clock=SystemClock(), home=tmp_path, environ=environ, connector=connector,
                      events=[telemetry])  # fmt: skip
    try:
        with anyio.fail_after(60):
            await run_contract(runtime, contract_from(CONTRACT, environ=environ), session_id="s1")
    finally:
        stats = telemetry.close(10)
    assert stats.exported >= 1 and stats.lost == 0
    recorded = [e.body for e in store.read_session("s1") if e.kind == "sandbox_egress"]
    assert [(b["host"], b["method"]) for b in recorded] == [
        ("[redacted].attacker.example", "CONNECT"),
        ("attacker.example", "GET[redacted]"),
    ]
    sent = b"".join(r.body for r in otlp.requests).lower()
    assert b"truss.server.sandbox_egress" in sent  # the reports did reach the collector, as span events
    assert SECRET.lower().encode() not in sent
    assert b"[redacted].attacker.example" in sent and b"get[redacted]" in sent
