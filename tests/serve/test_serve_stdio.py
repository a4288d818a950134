"""serve-mcp over stdio, driven by the SDK's client in both protocol eras."""

from __future__ import annotations

import sqlite3

import anyio
import pytest
from mcp import MCPError

from tests.serve.conftest import Site, stdio_client_for, structured

pytestmark = pytest.mark.anyio

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
            assert tools["truss_run_contract"].annotations.read_only_hint is False  # pyright: ignore[reportOptionalMemberAccess]
            assert tools["truss_run_contract"].annotations.destructive_hint is True  # pyright: ignore[reportOptionalMemberAccess]
            assert tools["truss_ledger_export"].annotations.read_only_hint is True  # pyright: ignore[reportOptionalMemberAccess]

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
    with sqlite3.connect(serve_site.home / "ledger.db") as db:
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
