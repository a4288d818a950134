"""`truss ledger export SESSION --format otlp-json`: a recorded session's spans, from the ledger alone.

The export of a live run is compared with the live spans in ``test_live_spans.py``; here: what the
command writes and refuses, the payload flags, and that a collector accepts the document as it is.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import httpx2
import pytest

from tests.telemetry.conftest import ledger, require_otel_extra, run_json, tools_contract, truss

require_otel_extra()
from tests.telemetry.receiver import Receiver, decode_json_request, flatten  # noqa: E402 - after the check

pytestmark = pytest.mark.slow

STEPS = """
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "exported later" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "/srv/x", text = "secret words" }
"""


@pytest.fixture
def session(tmp_path: Path, home: Path) -> str:
    """A finished session recorded without telemetry (the export needs none)."""
    contract = tools_contract(tmp_path, STEPS, server_extra='secret_args = ["/text"]\n')
    outcome = run_json(home, contract)
    assert outcome["status"] == "pass" and "telemetry" not in outcome
    return str(outcome["session"])


def test_the_document_is_an_otlp_request_a_collector_accepts_as_it_is(
    tmp_path: Path, home: Path, session: str, otlp: Receiver
) -> None:
    out = tmp_path / "spans.json"
    done = truss(home, "--json", "ledger", "export", session, "--format", "otlp-json", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "otlp-json"
    response = httpx2.post(
        f"{otlp.endpoint}/v1/traces",
        content=out.read_bytes(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200 and not otlp.refused
    received = otlp.spans()
    assert sorted(s["name"] for s in received) == sorted(
        ["invoke_agent otel", "chat", "chat", "chat", "execute_tool echo", "execute_tool write"]
    )
    assert received == flatten(decode_json_request(out.read_bytes()))


def test_payloads_are_in_the_export_only_when_asked_and_then_as_the_ledger_stores_them(
    home: Path, session: str
) -> None:
    plain = truss(home, "ledger", "export", session, "--format", "otlp-json")
    assert plain.returncode == 0, plain.stderr
    assert "gen_ai.tool.call.arguments" not in plain.stdout and "exported later" not in plain.stdout
    full = truss(home, "ledger", "export", session, "--format", "otlp-json", "--arguments", "--results")
    assert full.returncode == 0, full.stderr
    spans = {s["name"]: s["attributes"] for s in flatten(decode_json_request(full.stdout.encode()))}
    with ledger(home) as store:
        calls = [e for e in store.read_session(session) if e.kind == "mcp_tool_call"]
        stored = {e.body["tool"]: (store.blob(e.body["args"]), store.blob(e.body["result"])) for e in calls}
    args, result = stored["mcp:tools:echo"]
    assert spans["execute_tool echo"]["gen_ai.tool.call.arguments"] == (args or b"").decode()
    assert spans["execute_tool echo"]["gen_ai.tool.call.result"] == (result or b"").decode()
    assert json.loads(spans["execute_tool write"]["gen_ai.tool.call.arguments"])["text"] == "[redacted]"
    assert "secret words" not in full.stdout


def test_a_session_whose_record_was_changed_is_not_exported(tmp_path: Path, home: Path, session: str) -> None:
    with closing(sqlite3.connect(home / "ledger.db")) as db, db:
        # Make the record claim the model asked for nine calls in a turn: the spans would repeat the lie.
        db.execute(
            "UPDATE entries SET raw = replace(raw, '\"tool_calls\":1', '\"tool_calls\":9') "
            "WHERE session = ? AND kind = 'model_turn'",
            (session,),
        )
    out = tmp_path / "spans.json"
    done = truss(home, "--json", "ledger", "export", session, "--format", "otlp-json", "-o", str(out))
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"] == "VerificationError" and not out.exists()


def test_an_unknown_session_or_a_flag_of_the_other_format_is_refused(home: Path, session: str) -> None:
    unknown = truss(home, "--json", "ledger", "export", "s_nope", "--format", "otlp-json")
    assert unknown.returncode == 2 and json.loads(unknown.stdout)["error"] == "NotFoundError"
    bad = (["--arguments"], ["--results"], ["--trusted-key", "x+1+AA"], ["--format", "otlp-json", "--no-payloads"])
    for args in bad:
        done = truss(home, "--json", "ledger", "export", session, *args)
        assert done.returncode == 2, args
        assert json.loads(done.stdout)["error"] == "UsageError"
    bundle = truss(home, "ledger", "export", session)  # the default format is unchanged: the bundle
    assert bundle.returncode == 0 and json.loads(bundle.stdout)["entries"]
