"""`truss serve-mcp` with telemetry on: each run a caller starts is exported as the same span tree.

The server is started as an operator starts it (a subprocess speaking MCP over stdio), with
`[telemetry]` in the home's config.toml pointing at the real OTLP/HTTP receiver. The spans must
arrive while the server keeps running (a long-lived process exports in batches, not at exit), and
the server must still exit cleanly when its client goes away.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.serve.conftest import RawStdio, Site, call_line
from tests.telemetry.conftest import entries, require_otel_extra, telemetry_config, tools_contract, write_config

require_otel_extra()
from tests.telemetry.receiver import Receiver  # noqa: E402 - after the check that the extra is here

pytestmark = pytest.mark.slow

STEPS = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "a canary that is no span's business" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "/srv/notes.txt", text = "never written" }
[[policy.rules]]
tool = "mcp:tools:write"
effect = "deny"
reason = "nothing is written"
[budget]
max_tool_calls = 4
max_model_turns = 4
deadline = "1m"
"""


def test_a_run_started_through_serve_mcp_exports_its_agent_turn_and_tool_spans_while_the_server_runs(
    tmp_path: Path, home: Path, otlp: Receiver
) -> None:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    tools_contract(contracts, STEPS, name="served")
    # A short schedule delay: the batch leaves while the server keeps running, not only at its exit.
    write_config(home, telemetry_config(otlp.endpoint, 'schedule_delay = "200ms"\n'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("TRUSS_HOME", None)
    site = Site(home=home, contracts=contracts, env=env, tokens=tmp_path / "no-tokens", tmp=tmp_path)
    raw = RawStdio(site, "serve-telemetry")
    try:
        raw.initialize()
        raw.send(call_line(2, "truss_run_contract", {"contract": "served"}))
        reply = raw.reply()
        while reply.get("id") != 2:
            reply = raw.reply()
        answer = reply["result"]["structuredContent"]
        session = answer["session"]
        spans = otlp.wait_for(1 + 3 + 2, timeout_s=60)  # one leg, three turns, two calls
    finally:
        assert raw.proc.stdin is not None
        raw.proc.stdin.close()
        code, stderr = raw.close()
    assert code == 0, stderr
    assert "Traceback" not in stderr

    assert len(spans) == 6
    [agent] = [s for s in spans if s["name"] == "invoke_agent served"]
    calls = sorted((s for s in spans if s["name"].startswith("execute_tool ")), key=lambda s: s["start_ns"])
    turns = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert [s["name"] for s in calls] == ["execute_tool echo", "execute_tool write"]
    assert len(turns) == 3
    assert agent["parent_span_id"] is None
    assert all(s["parent_span_id"] == agent["span_id"] and s["trace_id"] == agent["trace_id"] for s in calls + turns)
    assert agent["attributes"]["truss.session.id"] == session == agent["attributes"]["gen_ai.conversation.id"]
    assert agent["attributes"]["truss.verdict.status"] == answer["status"]

    echo, write = (s["attributes"] for s in calls)
    assert (echo["mcp.method.name"], echo["gen_ai.tool.name"], echo["truss.server.name"]) == (
        "tools/call", "echo", "tools",
    )  # fmt: skip
    assert echo["truss.policy.decision"] == "allow"
    assert (write["truss.policy.decision"], write["error.type"]) == ("deny", "denied")

    # Each call's span points at the signed entry that recorded it.
    record = {e.seq: e for e in entries(home, session)}
    for span in calls:
        seq = span["attributes"]["truss.ledger.seq"]
        assert record[seq].body.get("tool") == span["attributes"]["truss.tool"]
    assert all("canary" not in repr(s) for s in spans)
