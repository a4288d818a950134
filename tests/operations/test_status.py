"""``truss status``: unfinished sessions with the command that moves each on, and quota use; never blocking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import REPO
from tests.durability.support import make_home
from tests.gate.support import contract_from, fake_connector, scripted
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.ledger.stores.base import LedgerStore
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

TEXT = """
[contract]
name = "watched"
intent = "read, then write with approval"
[budget]
max_tool_calls = 4
[policy]
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
[[quotas]]
name = "calls-a-day"
window = "24h"
tool_calls = 100
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
[[agent.steps]]
tool = "mcp:srv:read"
[[agent.steps]]
tool = "mcp:srv:write"
"""


def status_cmd(home: Path) -> list[str]:
    return [sys.executable, "-m", "truss", "--home", str(home), "status", "--json"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path / "home")


def _in_doubt(store: LedgerStore) -> None:
    store.append("s_doubt", [Record("session_started", {"contract": "watched"})])
    store.append("s_doubt", [Record("mcp_tool_intent", {"call": "c1.1", "tool": "mcp:srv:read", "args": None})])
    store.append("s_doubt", [Record("in_doubt", {"call": "c1.1", "tool": "mcp:srv:read"})])
    store.append("s_doubt", [Record("session_suspended", {"reason": "in_doubt", "calls": ["c1.1"]})])


async def test_status_lists_waiting_sessions_with_their_commands_and_quota_use_while_a_run_goes_on(
    home: Path,
) -> None:
    key = IdentityKey.load(home / "identity.key")
    clock = ManualClock(start_ms=1_800_000_000_000)
    store = open_store(str(home / "ledger.db"), key=key, clock=clock, create=True)
    release = anyio.Event()
    holding = anyio.Event()

    async def handler(tool: MountedTool, arguments: Any) -> ToolResult:
        if tool.tool == "read" and not release.is_set():
            holding.set()
            await release.wait()
        return text_result("ok")

    transport = FakeTransport(handler, tools=[mounted_tool("srv", "read"), mounted_tool("srv", "write")])
    runtime = Runtime(store=store, key=key, clock=clock, home=home, environ={},
                      connector=fake_connector(transport), provider=scripted())  # fmt: skip
    contract = contract_from(TEXT)
    try:
        _in_doubt(store)
        release.set()
        with anyio.fail_after(30):
            suspended = await run_contract(runtime, contract, session_id="s_asks")
        assert suspended.status == "suspended"
        release = anyio.Event()
        done: subprocess.CompletedProcess[bytes] | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: run_contract(runtime, contract, session_id="s_running"))
            with anyio.fail_after(30):
                await holding.wait()
                done = await anyio.run_process(status_cmd(home), cwd=REPO, env=dict(os.environ), check=False)
            release.set()
        assert done is not None and done.returncode == 0, done
        report: dict[str, Any] = json.loads(done.stdout)
    finally:
        store.close()

    by_id = {u["session"]: u for u in report["unfinished"]}
    assert by_id["s_asks"]["waiting_on"] == "approval" and by_id["s_asks"]["calls"] == ["c2.0"]
    assert any(c.startswith("truss approve s_asks c2.0") for c in by_id["s_asks"]["commands"])
    assert by_id["s_doubt"]["waiting_on"] == "in_doubt"
    assert any(c.startswith("truss resolve s_doubt c1.1") for c in by_id["s_doubt"]["commands"])
    assert by_id["s_running"]["status"] == "running"
    [quota] = report["quotas"]
    assert quota["quota"] == "calls-a-day" and quota["limit"]["tool_calls"] == 100
    assert set(quota["held_by"]) == {"s_asks", "s_running"} and quota["used"]["tool_calls"] == 8


def test_a_run_whose_process_died_is_listed_as_interrupted_with_the_resume_command(home: Path) -> None:
    key = IdentityKey.load(home / "identity.key")
    store = open_store(str(home / "ledger.db"), key=key, clock=ManualClock(start_ms=1_800_000_000_000), create=True)
    try:  # what a killed run leaves: entries up to a call sent, no session_suspended, no live lease
        store.append("s_killed", [Record("session_started", {"contract": "watched"})])
        store.append("s_killed", [Record("mcp_tool_intent", {"call": "c1.0", "tool": "mcp:srv:read", "args": None})])
    finally:
        store.close()
    done = subprocess.run(status_cmd(home), cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)["unfinished"]
    assert item["status"] == "interrupted" and item["waiting_on"] == "interrupted" and item["owner"] is None
    assert item["commands"] == ["truss resume s_killed"]


def test_status_of_a_home_without_a_ledger_exits_2_saying_what_to_run(home: Path) -> None:
    done = subprocess.run(status_cmd(home)[:-1], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no ledger" in done.stderr and "truss init" in done.stderr and "Traceback" not in done.stderr
