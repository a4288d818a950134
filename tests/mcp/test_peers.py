"""Third-party MCP servers over stdio: mcp-server-time and mcp-server-git (2026-07-28) and
server-everything (2025-11-25 handshake), connected together as one contract."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from tests.conftest import node_peer, python_peer
from tests.mcp._util import alive, contract_of, group_members
from truss._clock import SystemClock
from truss._errors import ToolCallError
from truss.mcp.client import connect

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.slow]


def _repo(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    (path / "notes.txt").write_text("hello\n")
    return path


async def test_three_real_servers_in_both_protocol_eras_mount_and_answer(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    node, script = node_peer("server-everything")
    contract = contract_of(
        {"name": "time", "command": python_peer("mcp-server-time"), "args": ["--local-timezone", "UTC"],
         "allow_tools": ["get_current_time"]},
        {"name": "git", "command": python_peer("mcp-server-git"), "args": ["--repository", str(repo)],
         "allow_tools": ["git_status", "git_log"]},
        {"name": "every", "command": node, "args": [script, "stdio"], "allow_tools": ["echo"]},
    )  # fmt: skip
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=SystemClock()) as m:
            assert m.servers["time"].protocol_version == "2026-07-28"
            assert m.servers["git"].protocol_version == "2026-07-28"
            assert m.servers["every"].protocol_version == "2025-11-25"
            assert m.servers["git"].filtered["git_reset"] == "not_allowlisted"
            now = await m.call(m.tools["mcp:time:get_current_time"], {"timezone": "UTC"}, timeout_s=10)
            status = await m.call(m.tools["mcp:git:git_status"], {"repo_path": str(repo)}, timeout_s=10)
            echo = await m.call(m.tools["mcp:every:echo"], {"message": "hi"}, timeout_s=10)
            _, method = await m.round_trip("every")
            pids = m.pids()
            members = [p for pid in pids.values() for p in group_members(pid)]
    assert now.structured["timezone"] == "UTC"
    assert "notes.txt" in status.text
    assert echo.text == "Echo: hi"
    assert method == "ping"
    assert "_meta" not in now.wire
    assert set(pids) == {"time", "git", "every"}
    assert not any(alive(p) for p in members)
    assert (tmp_path / "logs" / "git.stderr.log").exists()


async def test_task_required_tool_runs_as_an_mcp_task_that_can_be_polled(tmp_path: Path) -> None:
    node, script = node_peer("server-everything")
    contract = contract_of(
        {
            "name": "every",
            "command": node,
            "args": [script, "stdio"],
            "allow_tools": ["simulate-research-query", "echo"],
        }
    )
    messages: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path, clock=SystemClock()) as m:
            research = m.tools["mcp:every:simulate-research-query"]
            assert await m.start_task(m.tools["mcp:every:echo"], {"message": "x"}, timeout_s=5) is None
            task = await m.start_task(research, {"topic": "pins"}, timeout_s=30)
            assert task is not None
            assert await m.task_result(research, task, timeout_s=0.2) is None
            result = await m.task_result(research, task, timeout_s=30, progress=on_progress)
            with pytest.raises(ToolCallError) as info:
                await m.task_result(research, "no-such-task", timeout_s=5)
    assert result is not None and not result.is_error
    assert "pins" in result.text
    assert messages
    assert (info.value.cause, info.value.task, info.value.tool) == (
        "task_unknown",
        "no-such-task",
        "simulate-research-query",
    )
