"""A contract without done checks no longer passes whatever happened: a run passes only when a call
succeeded and none was denied, unless the contract says ``[done] pass_without_checks = true``.

Before, a run whose every call failed or was denied ended ``pass`` (there was nothing to check).
Each case runs a contract through ``run_contract`` with a fake server, as a run would.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import truss_cmd
from tests.gate.support import fake_connector, new_store
from truss import ContractError
from truss.contract import Contract, load_contract_text
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

HEAD = """
[contract]
name = "no-checks"
intent = "call a tool"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["count", "broken"]
"""
COUNT = '[[agent.steps]]\ntool = "mcp:srv:count"\n'
BROKEN = '[[agent.steps]]\ntool = "mcp:srv:broken"\n'
DENY_COUNT = '[[policy.rules]]\ntool = "mcp:srv:count"\neffect = "deny"\nreason = "not today"\n'
OPT_OUT = "[done]\npass_without_checks = true\n"


def run_truss(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*truss_cmd(), "--home", str(cwd / "home"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


async def _run(text: str, tmp_path: Path) -> RunOutcome:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result("failed", is_error=True) if tool.tool == "broken" else text_result("counted")

    contract: Contract = load_contract_text(HEAD + text, source="c.toml")
    fake = FakeTransport(handler, tools=[mounted_tool("srv", "count"), mounted_tool("srv", "broken")])
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    with anyio.fail_after(30):
        return await run_contract(
            Runtime(store=store, key=key, clock=clock, home=tmp_path / "h", environ={}, connector=fake_connector(fake)),
            contract,
        )


@pytest.mark.parametrize(
    ("plan", "status"),
    [
        (BROKEN, "fail"),  # every call returned an error result
        (DENY_COUNT + COUNT, "fail"),  # the only call was denied
        (DENY_COUNT + BROKEN + COUNT, "fail"),
        ("", "fail"),  # no call at all
        (BROKEN + COUNT, "pass"),  # one call succeeded, none was denied
    ],
    ids=["every_call_failed", "a_call_denied", "failed_and_denied", "no_call", "one_call_succeeded"],
)
async def test_a_contract_without_done_checks_passes_only_when_a_call_succeeded_and_none_was_denied(
    tmp_path: Path, plan: str, status: str
) -> None:
    outcome = await _run(plan, tmp_path)
    assert outcome.status == status
    assert outcome.verdict is not None and outcome.verdict["checks"] == []
    if status == "fail":
        assert outcome.exit_code == 1 and outcome.verdict["reason"]


@pytest.mark.parametrize(
    "plan", [BROKEN, DENY_COUNT + COUNT, ""], ids=["every_call_failed", "a_call_denied", "no_call"]
)
async def test_pass_without_checks_passes_a_run_whatever_its_calls_did(tmp_path: Path, plan: str) -> None:
    outcome = await _run(OPT_OUT + plan, tmp_path)
    assert (outcome.status, outcome.exit_code) == ("pass", 0)


def test_pass_without_checks_beside_done_checks_is_refused_at_load_with_its_key_path() -> None:
    check = '[[done.checks]]\nkind = "tool_succeeded"\ntool = "mcp:srv:count"\n'
    with pytest.raises(ContractError) as caught:
        load_contract_text(HEAD + COUNT + OPT_OUT + check, source="c.toml")
    assert caught.value.fields["path"] == "done.pass_without_checks"


def test_contract_check_warns_about_a_contract_without_done_checks_and_still_exits_0(tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text(HEAD + COUNT, encoding="utf-8")
    opted = tmp_path / "opted.toml"
    opted.write_text(HEAD + COUNT + OPT_OUT, encoding="utf-8")
    warned = run_truss(tmp_path, "--json", "contract", "check", str(bare))
    assert warned.returncode == 0, warned.stderr
    assert [w["path"] for w in json.loads(warned.stdout)["warnings"]] == ["done.checks"]
    human = run_truss(tmp_path, "contract", "check", str(bare))
    assert human.returncode == 0 and "warning" in human.stderr and "done.checks" in human.stderr
    quiet = run_truss(tmp_path, "--json", "contract", "check", str(opted))
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["warnings"] == []
