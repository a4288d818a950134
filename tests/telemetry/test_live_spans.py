"""`truss run` with telemetry on, as an operator runs it: spans reach a real OTLP/HTTP receiver on 127.0.0.1.

Each test runs `truss` as a subprocess against the wire-level tools server, with `[telemetry]` in
the home's config.toml pointing at the receiver, and checks what the receiver decoded from the
protobuf (or JSON) bodies it was sent: names, kinds, parent links, the GenAI and MCP attributes,
the `truss.*` attributes against the signed record, and what must never be there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.telemetry.conftest import (
    entries,
    ledger,
    make_home,
    require_otel_extra,
    run_json,
    telemetry_config,
    tools_contract,
    truss,
    write_config,
)

require_otel_extra()
from tests.telemetry.receiver import Receiver, decode_json_request, flatten  # noqa: E402 - after the check that the extra is here

pytestmark = pytest.mark.slow

STEPS = """
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "hello, collector" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "/srv/notes.txt", text = "never written" }
[[agent.steps]]
tool = "mcp:tools:has_env"
arguments = { name = "HOME" }
[[agent.steps]]
tool = "mcp:tools:slow"
arguments = { seconds = 3 }
[[policy.rules]]
tool = "mcp:tools:write"
effect = "deny"
reason = "nothing is written"
"""
SLOW = """
[[mcp.servers.tools]]
name = "slow"
call_timeout = "300ms"
"""

INTERNAL, CLIENT = 1, 3
ERROR = 2


def by_name(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        out.setdefault(span["name"], []).append(span)
    return out


@dataclass(frozen=True)
class Recorded:
    outcome: dict[str, Any]
    spans: list[dict[str, Any]]
    home: Path
    bodies: bytes  # every request body the receiver took, decompressed
    content_types: set[str]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """One run of the four-call contract with telemetry on, shared by the tests that read it."""
    require_otel_extra()
    from tests.telemetry.receiver import receiver

    tmp = tmp_path_factory.mktemp("recorded")
    home = make_home(tmp)
    with receiver() as otlp:
        write_config(home, telemetry_config(otlp.endpoint))
        outcome = run_json(home, tools_contract(tmp, STEPS, server_extra=SLOW))
        bodies = b"".join(r.body for r in otlp.requests)
        yield Recorded(outcome, otlp.spans(), home, bodies, {r.content_type for r in otlp.requests})


def test_a_run_sends_an_agent_span_a_chat_span_per_turn_and_an_execute_tool_span_per_call(recorded: Recorded) -> None:
    outcome, spans = recorded.outcome, recorded.spans
    assert outcome["telemetry"]["exported"] == len(spans) == outcome["telemetry"]["offered"]
    names = by_name(spans)
    [agent] = names["invoke_agent otel"]
    turns = names["chat"]  # the scripted provider has no model name: the span is named "chat"
    assert len(turns) == 5  # four planned calls, then the turn that ends the run
    calls = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert sorted(s["name"] for s in calls) == [
        "execute_tool echo", "execute_tool has_env", "execute_tool slow", "execute_tool write",
    ]  # fmt: skip
    assert len(spans) == 1 + 5 + 4

    # One trace per session; the leg is the root; turns and calls are its children.
    assert {s["trace_id"] for s in spans} == {agent["trace_id"]}
    assert len({s["span_id"] for s in spans}) == len(spans)
    assert agent["parent_span_id"] is None
    assert all(s["parent_span_id"] == agent["span_id"] for s in turns + calls)
    assert (agent["kind"], {s["kind"] for s in turns}, {s["kind"] for s in calls}) == (INTERNAL, {CLIENT}, {INTERNAL})
    assert all(s["start_ns"] <= s["end_ns"] for s in spans)
    assert agent["start_ns"] <= min(s["start_ns"] for s in spans) and agent["end_ns"] >= max(s["end_ns"] for s in spans)
    assert agent["resource"]["service.name"] == "truss" and agent["scope"]["name"] == "truss"


def test_the_spans_follow_the_genai_and_mcp_conventions_and_link_to_the_signed_record(recorded: Recorded) -> None:
    outcome, spans = recorded.outcome, recorded.spans
    session = outcome["session"]
    record = entries(recorded.home, session)
    at = {e.seq: e for e in record}
    names = by_name(spans)
    agent = names["invoke_agent otel"][0]["attributes"]
    assert agent["gen_ai.operation.name"] == "invoke_agent"
    assert (agent["gen_ai.agent.name"], agent["gen_ai.provider.name"]) == ("otel", "scripted")
    assert agent["gen_ai.conversation.id"] == agent["truss.session.id"] == session
    assert agent["truss.contract.hash"] == record[0].body["contract_hash"]
    assert (agent["truss.session.status"], agent["truss.verdict.status"]) == (outcome["status"],) * 2
    assert (agent["truss.ledger.seq"], agent["truss.ledger.index"]) == (record[-1].seq, record[-1].index)
    assert (agent["truss.leg.start_seq"], agent["truss.resumed"]) == (0, False)

    for span in names["chat"]:
        attrs = span["attributes"]
        turn = at[attrs["truss.ledger.seq"]]
        assert turn.kind == "model_turn" and turn.index == attrs["truss.ledger.index"]
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["truss.turn"] == turn.body["turn"]
        assert attrs["gen_ai.usage.input_tokens"] == turn.body["usage"]["input_tokens"]
        assert attrs["gen_ai.usage.output_tokens"] == turn.body["usage"]["output_tokens"]
        assert attrs["truss.turn.tool_calls"] == turn.body["tool_calls"]
        assert span["status"] == 0 and "error.type" not in attrs

    calls = {s["attributes"]["gen_ai.tool.call.id"]: s for s in spans if s["name"].startswith("execute_tool ")}
    for call, span in calls.items():
        attrs = span["attributes"]
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["mcp.method.name"] == "tools/call"
        assert attrs["gen_ai.tool.name"] == span["name"].removeprefix("execute_tool ")
        assert attrs["truss.tool"] == f"mcp:tools:{attrs['gen_ai.tool.name']}"
        assert attrs["truss.server.name"] == "tools" and attrs["gen_ai.agent.name"] == "otel"
        last = at[attrs["truss.ledger.seq"]]
        assert last.body["call"] == call and last.index == attrs["truss.ledger.index"]
        assert attrs["truss.turn"] == last.body["turn"]
        assert span["status"] == (ERROR if "error.type" in attrs else 0)

    echo = calls["c1.0"]["attributes"]
    assert (echo["truss.call.outcome"], echo["truss.policy.decision"]) == ("ok", "allow")
    assert at[echo["truss.ledger.seq"]].kind == "mcp_tool_call" and "error.type" not in echo
    write = calls["c2.0"]["attributes"]
    assert (write["truss.call.outcome"], write["error.type"], write["truss.deny.code"]) == ("denied", "denied", "rule")
    assert (write["truss.policy.decision"], write["truss.policy.rule"]) == ("deny", 0)
    assert at[write["truss.ledger.seq"]].kind == "mcp_tool_denied"
    slow = calls["c4.0"]["attributes"]
    assert (slow["truss.call.outcome"], slow["error.type"], slow["truss.failure.cause"]) == ("failed",) + (
        "timeout",
    ) * 2


def test_spans_hold_no_argument_or_result_content_and_no_free_text_by_default(recorded: Recorded) -> None:
    for span in recorded.spans:
        assert "gen_ai.tool.call.arguments" not in span["attributes"]
        assert "gen_ai.tool.call.result" not in span["attributes"]
    for text in (b"hello, collector", b"/srv/notes.txt", b"never written", b"nothing is written", b"slept"):
        assert text not in recorded.bodies  # arguments, results and the policy's reason: none reach the collector
    assert recorded.content_types == {"application/x-protobuf"}


def test_with_record_arguments_and_results_a_span_holds_the_payloads_exactly_as_the_ledger_stores_them(
    tmp_path: Path, home: Path, otlp: Receiver
) -> None:
    write_config(home, telemetry_config(otlp.endpoint, "record_arguments = true\nrecord_results = true\n"))
    steps = '[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "visible, and then hidden" }\n'
    contract = tools_contract(tmp_path, steps, server_extra='secret_args = ["text"]\n')
    outcome = run_json(home, contract)
    [span] = [s for s in otlp.spans() if s["name"] == "execute_tool echo"]
    [call] = [e for e in entries(home, outcome["session"]) if e.kind == "mcp_tool_call"]
    with ledger(home) as store:
        stored_args, stored_result = store.blob(call.body["args"]), store.blob(call.body["result"])
    assert stored_args is not None and stored_result is not None
    assert span["attributes"]["gen_ai.tool.call.arguments"] == stored_args.decode()
    assert span["attributes"]["gen_ai.tool.call.result"] == stored_result.decode()
    assert json.loads(stored_args) == {"text": "[redacted]"}  # secret_args, redacted before it was stored
    assert b"visible, and then hidden" not in b"".join(r.body for r in otlp.requests)


def test_http_json_and_gzip_reach_the_collector_as_valid_otlp(tmp_path: Path, home: Path, otlp: Receiver) -> None:
    write_config(home, telemetry_config(otlp.endpoint, 'protocol = "http/json"\ncompression = "gzip"\n'))
    steps = '[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "json" }\n'
    outcome = run_json(home, tools_contract(tmp_path, steps))
    assert outcome["telemetry"]["exported"] == 4 and not otlp.refused
    assert {(r.content_type, r.headers.get("content-encoding")) for r in otlp.requests} == {
        ("application/json", "gzip")
    }
    assert {s["name"] for s in otlp.spans()} == {"chat", "execute_tool echo", "invoke_agent otel"}


def test_the_standard_otel_variables_configure_a_run_when_the_operator_config_is_silent(
    tmp_path: Path, home: Path, otlp: Receiver
) -> None:
    steps = '[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "env" }\n'
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": "ops-truss",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ops",
    }
    outcome = run_json(home, tools_contract(tmp_path, steps), env=env)
    assert outcome["telemetry"]["exported"] == 4
    [agent] = [s for s in otlp.spans() if s["name"] == "invoke_agent otel"]
    assert agent["resource"]["service.name"] == "ops-truss"
    assert agent["resource"]["deployment.environment.name"] == "test"
    assert {r.headers.get("x-tenant") for r in otlp.requests} == {"ops"}


def test_the_operator_config_wins_over_the_environment(tmp_path: Path, home: Path, otlp: Receiver) -> None:
    write_config(home, telemetry_config(otlp.endpoint, 'service_name = "from-config"\n'))
    steps = '[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "both" }\n'
    # The environment names a port nothing listens on: were it used, every span would fail.
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SERVICE_NAME": "from-env"}
    outcome = run_json(home, tools_contract(tmp_path, steps), env=env)
    assert outcome["telemetry"]["exported"] == 4 and outcome["telemetry"]["failed"] == 0
    assert {s["resource"]["service.name"] for s in otlp.spans()} == {"from-config"}


def test_the_otlp_json_export_of_a_session_has_the_live_spans_ids_names_parents_and_attributes(
    recorded: Recorded,
) -> None:
    outcome, live, home = recorded.outcome, recorded.spans, recorded.home
    done = truss(home, "ledger", "export", outcome["session"], "--format", "otlp-json")
    assert done.returncode == 0, done.stderr
    exported = flatten(decode_json_request(done.stdout.encode()))  # a valid ExportTraceServiceRequest
    assert len(exported) == len(live)
    by_id = {s["span_id"]: s for s in live}
    for span in exported:
        twin = by_id[span["span_id"]]
        for key in ("trace_id", "parent_span_id", "name", "kind", "attributes", "status"):
            assert span[key] == twin[key], (span["name"], key)
        assert span["resource"] == twin["resource"] and span["scope"] == twin["scope"]
    again = truss(home, "ledger", "export", outcome["session"], "--format", "otlp-json")
    assert again.stdout == done.stdout  # ids and times come from the record: a re-export is the same document


def test_a_resumed_session_exports_each_recorded_step_once_in_the_leg_that_recorded_it(
    tmp_path: Path, home: Path, otlp: Receiver
) -> None:
    write_config(home, telemetry_config(otlp.endpoint))
    steps = """
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "before" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "/srv/a", text = "after approval" }
[[policy.rules]]
tool = "mcp:tools:write"
effect = "ask"
"""
    first = run_json(home, tools_contract(tmp_path, steps))
    session = first["session"]
    assert (first["status"], first["waiting"]) == ("suspended", ["c2.0"])
    assert truss(home, "approve", session, "c2.0").returncode == 0
    second = truss(home, "--json", "resume", session)
    assert second.returncode == 0, second.stderr
    live = otlp.spans()
    legs = [s for s in live if s["parent_span_id"] is None]
    assert [(s["attributes"]["truss.resumed"], s["attributes"]["truss.session.status"]) for s in legs] == [
        (False, "suspended"), (True, "pass"),
    ]  # fmt: skip
    assert legs[0]["attributes"]["truss.suspend.reason"] == "approval"
    replayed = [s for s in live if s["attributes"].get("truss.replayed") is True]
    assert {s["parent_span_id"] for s in replayed} == {legs[1]["span_id"]} and replayed

    done = truss(home, "ledger", "export", session, "--format", "otlp-json")
    assert done.returncode == 0, done.stderr
    exported = {s["span_id"]: s for s in flatten(decode_json_request(done.stdout.encode()))}
    fresh = {s["span_id"]: s for s in live if s["attributes"].get("truss.replayed") is not True}
    assert exported.keys() == fresh.keys()
    for span_id, span in exported.items():
        assert (span["name"], span["parent_span_id"], span["attributes"]) == (
            fresh[span_id]["name"], fresh[span_id]["parent_span_id"], fresh[span_id]["attributes"],
        )  # fmt: skip
    asked = [s for s in exported.values() if s["attributes"].get("gen_ai.tool.call.id") == "c2.0"]
    assert sorted((s["attributes"]["truss.call.outcome"], s["attributes"]["truss.policy.decision"]) for s in asked) == [
        ("ok", "ask"), ("suspended", "ask"),
    ]  # fmt: skip


def test_every_attribute_a_span_carries_is_documented_in_docs_telemetry_md(recorded: Recorded) -> None:
    text = (REPO / "docs" / "telemetry.md").read_text(encoding="utf-8")
    keys = {key for span in recorded.spans for key in span["attributes"]}
    keys |= {"gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "truss.wait.reason", "truss.budget.limit"}
    missing = sorted(key for key in keys if f"`{key}`" not in text)
    assert not missing, f"docs/telemetry.md does not document {missing}"
