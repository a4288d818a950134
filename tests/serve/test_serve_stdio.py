"""serve-mcp over stdio, driven by the SDK's client in both protocol eras."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from typing import Any

import anyio
import pytest
from mcp import MCPError

from tests.serve.conftest import RawStdio, Site, call_line, stdio_client_for, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODES = ["auto", "legacy"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_delegated_run_returns_the_signed_verdict_and_its_evidence(serve_site: Site, mode: str) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    with anyio.fail_after(90):
        async with stdio_client_for(serve_site, mode=mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {
                "truss_run_contract",
                "truss_contract_status",
                "truss_ledger_verdict",
                "truss_ledger_export",
            }
            for tool in tools.values():
                assert tool.output_schema is not None
                assert tool.input_schema.get("additionalProperties") is False
                assert tool.annotations is not None
            run_hints, export_hints = tools["truss_run_contract"].annotations, tools["truss_ledger_export"].annotations
            assert run_hints is not None and export_hints is not None
            assert run_hints.read_only_hint is False and run_hints.destructive_hint is True
            # The export may sign and store a checkpoint (a suspended run has none yet): not read-only.
            assert export_hints.read_only_hint is False and export_hints.destructive_hint is False
            verdict_hints = tools["truss_ledger_verdict"].annotations
            assert verdict_hints is not None and verdict_hints.read_only_hint is True

            result = await client.call_tool("truss_run_contract", {"contract": "hello"}, progress_callback=on_progress)
            answer = structured(result)
            assert not result.is_error
            assert answer["status"] == "pass"
            assert answer["verdict"]["status"] == "pass"
            assert len(answer["head"]) == 64
            assert answer["checkpoint"]
            assert answer["bundle_ref"] == {"tool": "truss_ledger_export", "arguments": {"session": answer["session"]}}
            assert seen and seen == sorted(seen)

            session = answer["session"]
            status = structured(await client.call_tool("truss_contract_status", {"session": session}))
            assert status["status"] == "pass" and status["running"] is False
            assert status["head"] == answer["head"]
            assert status["verification"]["ok"] is True
            assert status["counts"]["tool_calls"] == 2
            assert status["budget_used"]["tool_calls"] == 2

            verdict = structured(await client.call_tool("truss_ledger_verdict", {"session": session}))
            assert verdict["envelope"]["payloadType"] == "application/vnd.in-toto+json"

            export = structured(await client.call_tool("truss_ledger_export", {"session": session}))
            assert export["inline"] is True and export["bundle"] is not None


async def test_a_repeated_session_id_returns_that_session_and_never_runs_twice(serve_site: Site) -> None:
    with anyio.fail_after(90):
        async with stdio_client_for(serve_site) as client:
            first = structured(
                await client.call_tool("truss_run_contract", {"contract": "hello", "session_id": "job-1"})
            )
            again = structured(
                await client.call_tool("truss_run_contract", {"contract": "hello", "session_id": "job-1"})
            )
            by_id = structured(
                await client.call_tool("truss_run_contract", {"contract": "hello", "session_id": first["session"]})
            )
    assert first["status"] == "pass"
    assert again == first
    assert by_id == first
    with closing(sqlite3.connect(serve_site.home / "ledger.db")) as db, db:
        started = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    assert started == 1


async def test_a_tool_name_outside_the_four_is_an_unknown_tool_error(serve_site: Site) -> None:
    with anyio.fail_after(60):
        async with stdio_client_for(serve_site, mode="legacy") as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("mcp__time__get_current_time", {})
    assert caught.value.code == -32602


async def test_an_async_run_returns_its_handle_at_once_and_status_reports_progress(serve_site: Site) -> None:
    flag = serve_site.flag("async-run")
    with anyio.fail_after(90):
        async with stdio_client_for(serve_site) as client:
            handle = structured(
                await client.call_tool(
                    "truss_run_contract", {"contract": "gated", "params": {"flag": str(flag)}, "async": True}
                )
            )
            assert handle["status"] == "running"
            assert handle["verdict"] is None and handle["bundle_ref"] is None
            status = structured(await client.call_tool("truss_contract_status", {"session": handle["session"]}))
            assert status["running"] is True and status["status"] == "running"
            flag.touch()
            # A synchronous request for the same session waits for the run it already has.
            done = structured(
                await client.call_tool("truss_run_contract", {"contract": "gated", "session_id": handle["session"]})
            )
    assert done["session"] == handle["session"]
    assert done["status"] == "pass"


def test_stdout_carries_only_protocol_messages_and_oversized_or_deep_requests_get_errors(serve_site: Site) -> None:
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    raw = RawStdio(serve_site, "hygiene")
    raw.initialize()
    raw.send(call_line(2, "truss_run_contract", {"contract": "hello", "padding": "x" * 1_100_000}))
    raw.send(call_line(3, "truss_run_contract", {"contract": "hello", "params": {"p": deep}}))
    raw.send("this is not json\n")
    raw.send(call_line(4, "truss_run_contract", {"contract": "hello"}))
    seen: list[dict[str, Any]] = []
    try:
        while not any(r.get("id") == 4 for r in seen):
            seen.append(raw.reply())
    finally:
        assert raw.proc.stdin is not None
        raw.proc.stdin.close()
        code, stderr = raw.close()
    while not raw.replies.empty():
        seen.append(json.loads(raw.replies.get()))
    assert code == 0
    assert all(r.get("jsonrpc") == "2.0" for r in seen)
    by_id = {r.get("id"): r for r in seen}
    assert by_id[2]["error"]["code"] == -32600
    assert by_id[3]["error"]["code"] == -32600
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[4]["result"]["structuredContent"]["status"] == "pass"
    assert "Traceback" not in stderr


def test_sigterm_records_runs_as_interrupted_and_a_later_server_resumes_them_by_handle(serve_site: Site) -> None:
    flag = serve_site.flag("sigterm")
    call = {"contract": "gated", "params": {"flag": str(flag)}, "session_id": "long-job", "async": True}
    raw = RawStdio(serve_site, "sigterm")
    raw.initialize()
    raw.send(call_line(1, "truss_run_contract", call))
    handle = raw.reply()["result"]["structuredContent"]
    raw.send(call_line(2, "truss_contract_status", {"session": handle["session"]}))
    for _ in range(20_000):  # until the run has reached its blocking call (each round trip is a request)
        status = raw.reply()["result"]
        if status.get("structuredContent", {}).get("progress"):
            break
        raw.send(call_line(2, "truss_contract_status", {"session": handle["session"]}))
    else:
        raise AssertionError("the run never reported progress")
    raw.proc.send_signal(signal.SIGTERM)
    code, stderr = raw.close()
    assert code == 0 and "Traceback" not in stderr

    again = RawStdio(serve_site, "resume")
    again.initialize()
    again.send(call_line(1, "truss_contract_status", {"session": handle["session"]}))
    assert again.reply()["result"]["structuredContent"]["status"] == "interrupted"
    flag.touch()
    again.send(call_line(2, "truss_run_contract", {**call, "async": False}))
    resumed = again.reply()["result"]["structuredContent"]
    assert again.proc.stdin is not None
    again.proc.stdin.close()
    assert again.close()[0] == 0
    assert resumed["session"] == handle["session"]
    assert resumed["status"] == "pass"


_LAST_REQUESTS = {
    "tools/list": json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) + "\n",
    "status": call_line(1, "truss_contract_status", {"session": "nope"}),
    "run": call_line(1, "truss_run_contract", {"contract": "hello"}),  # a run is still in flight at the end
}


@pytest.mark.parametrize("attempt", range(3))
@pytest.mark.parametrize("request_kind", list(_LAST_REQUESTS))
async def test_a_request_written_just_before_stdin_closes_is_answered(
    serve_site: Site, request_kind: str, attempt: int
) -> None:
    # The SDK's loop cancelled what was in flight at the end of input: tools/list went unanswered 4 times in 5.
    raw = RawStdio(serve_site, f"closing-{request_kind.replace('/', '-')}-{attempt}")
    raw.initialize()
    raw.send(_LAST_REQUESTS[request_kind])
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert raw.reply(timeout=120)["id"] == 1
    code, stderr = raw.close()
    assert code == 0, stderr
