"""The public API as an embedding program uses it: one ``Runtime`` passed to every verb, and
``truss.ledger.verify`` in its one form (a report, with ``raise_for_failure``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import truss
import truss.ledger
from tests.gate.support import contract_from
from truss.events import ProgressEvent, progress_subscriber
from truss.ledger.keys import IdentityKey
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

CONTRACT = """
[contract]
name = "embedded"
intent = "read, then write after a person agrees"
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:srv:read"
arguments = { path = "a" }
[[agent.steps]]
tool = "mcp:srv:write"
arguments = { path = "b" }
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "writes need a person"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:write"
"""


def _connector(transport: FakeTransport) -> Any:
    @asynccontextmanager
    async def connect(contract: Any, **_: Any) -> AsyncGenerator[FakeTransport]:
        yield transport

    return connect


def _transport() -> FakeTransport:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result(f"{tool.tool} {arguments.get('path')}")

    return FakeTransport(handler, tools=[mounted_tool("srv", "read"), mounted_tool("srv", "write")])


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    IdentityKey.create(home / "identity.key", "embedded.truss.test")
    return home


async def test_one_runtime_runs_approves_resumes_and_replays_a_session_through_the_public_api(tmp_path: Path) -> None:
    transport = _transport()
    events: list[ProgressEvent] = []
    with truss.Runtime.open(
        home=_home(tmp_path),
        create=True,
        clock=ManualClock(),
        environ={},
        connector=_connector(transport),
        events=[progress_subscriber(events.append)],
    ) as runtime:
        contract = contract_from(CONTRACT)
        with anyio.fail_after(30):
            first = await truss.run_contract(runtime, contract, session_id="emb-1")
        assert (first.status, first.waiting) == ("suspended", ("c2.0",))
        truss.approve_call(runtime, "emb-1", "c2.0", approved=True, reason="fine")
        with anyio.fail_after(30):
            second = await truss.resume_session(runtime, "emb-1")
        assert second.status == "pass" and second.exit_code == 0
        assert [c.tool for c in transport.calls] == ["mcp:srv:read", "mcp:srv:write"]
        assert any(e.kind == "verdict" for e in events), "the runtime's subscriber saw the run"

        replayed = await truss.replay_session(dataclasses.replace(runtime, connector=None), "emb-1")
        assert replayed.matches, replayed.reason
        report = truss.ledger.verify(runtime.store, runtime.trusted, session="emb-1")
        assert report.raise_for_failure() is report and report.entries == len(list(runtime.store.read_session("emb-1")))


async def test_a_runtime_with_the_memory_store_runs_a_contract_and_its_log_verifies(tmp_path: Path) -> None:
    key = IdentityKey.from_seed(bytes(range(32)), "memory.truss.test")
    store = truss.ledger.open_store("memory:", key=key, clock=ManualClock())
    runtime = truss.Runtime(
        store=store, key=key, clock=ManualClock(), home=tmp_path, connector=_connector(_transport())
    )
    contract = contract_from(CONTRACT.replace('effect = "ask"', 'effect = "allow"'))
    with anyio.fail_after(30):
        outcome = await truss.run_contract(runtime, contract)
    assert outcome.status == "pass"
    assert truss.ledger.verify(store, [key.verifier]).ok


async def test_a_run_needs_a_connector_and_a_key_and_records_nothing_without_them(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with truss.Runtime.open(home=home, create=True, clock=ManualClock(), environ={}) as runtime:
        with pytest.raises(truss.UsageError):
            await truss.run_contract(runtime, contract_from(CONTRACT), session_id="no-connector")
        assert runtime.store.session("no-connector") is None
    with truss.Runtime.open(home=home, signing=False, connector=_connector(_transport())) as reader:
        with pytest.raises(truss.KeyFileError):
            await truss.run_contract(reader, contract_from(CONTRACT), session_id="no-key")
        assert reader.store.sessions() == []


def test_runtime_open_reads_the_home_layout_and_refuses_a_missing_ledger_unless_asked_to_create(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path)
    with pytest.raises(truss.NotFoundError):
        truss.Runtime.open(home=home)
    with truss.Runtime.open(home=home, create=True, environ={"A": "1", "TOKEN": "s3cr3t-value"}) as runtime:
        assert isinstance(runtime.store, truss.LedgerStore)
        assert runtime.signer.name == "embedded.truss.test" and runtime.environ["A"] == "1"
        assert "s3cr3t-value" not in repr(runtime), "a runtime in a log line shows no secret"
        assert list(runtime.trusted) == [runtime.signer.verifier]
    assert (home / "ledger.db").is_file()
    with truss.Runtime.open(home=home, db=f"sqlite://{home / 'ledger.db'}", signing=False) as reader:
        assert reader.key is None and reader.store.origin == "embedded.truss.test"
        with pytest.raises(truss.KeyFileError):
            _ = reader.signer


def test_verify_over_bundle_bytes_returns_a_bundle_report_whose_helper_raises_when_tampered(tmp_path: Path) -> None:
    key = IdentityKey.from_seed(bytes(range(32)), "bundle.truss.test")
    store = truss.ledger.open_store("memory:", key=key, clock=ManualClock())
    store.append("s_b", [truss.ledger.Record("session_started", {"contract": "c"})])
    data = truss.ledger.export_bundle(store, "s_b", vkey=key.verifier.vkey, signer=key)
    report = truss.ledger.verify(data, [key.verifier])
    assert isinstance(report, truss.ledger.BundleReport) and report.raise_for_failure().session == "s_b"

    doc = json.loads(data)
    doc["entries"][0]["entry"]["body"]["contract"] = "forged"
    tampered = truss.ledger.verify(json.dumps(doc).encode(), [key.verifier])
    assert not tampered.ok
    with pytest.raises(truss.VerificationError) as caught:
        tampered.raise_for_failure()
    assert caught.value.fields["reason"] == tampered.reason
    with pytest.raises(truss.BundleFormatError):
        truss.ledger.verify(b"not json", [key.verifier]).raise_for_failure()
    untyped: Any = truss.ledger.verify  # the overloads refuse this call; a caller without types may try it
    with pytest.raises(truss.UsageError):
        untyped(data, [key.verifier], session="s_b")
