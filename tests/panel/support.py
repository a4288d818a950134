"""Helpers of the panel tests: contracts with a panel check, a whole run in-process, the record.

The agent is the scripted provider (its plan and final answer are in the contract), the tools a
``FakeTransport`` with three tools: ``read`` (succeeds, says what it read), ``broken`` (an error
result) and ``write`` (denied by the contract's policy). Reviewers are scripted or real providers
against loopback servers (``tests/providers/_support.py``), as each test says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.gate.support import contract_from, fake_connector, new_store, scripted
from truss.ledger.entry import StoredEntry
from truss.ledger.stores.sqlite import SqliteStore
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult, error_result

SESSION = "s_panel"


async def tools(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    if tool.tool == "read":
        return text_result(f"the file {arguments.get('path')} says: version 2.1")
    if tool.tool == "broken":
        return error_result("the tool broke")
    return text_result("written")


def transport() -> FakeTransport:
    return FakeTransport(tools, tools=[mounted_tool("srv", name) for name in ("read", "broken", "write")])


def panel_contract(
    *,
    final: str,
    reviewers: str,
    quorum: int,
    steps: tuple[tuple[str, dict[str, Any]], ...] = (("read", {"path": "VERSION"}),),
    panel: str = "",
    budget: str = "",
    extra_checks: str = "",
    agent: str = "",
) -> str:
    """A contract whose plan calls ``steps`` (tool names of server ``srv``), answers ``final``, and whose
    one done check is a panel of ``reviewers`` (TOML of ``[[done.checks.reviewers]]`` tables)."""
    plan = "".join(f'[[agent.steps]]\ntool = "mcp:srv:{t}"\narguments = {_inline(a)}\n' for t, a in steps)
    return f"""
[contract]
name = "panel-test"
intent = "Find the version in the VERSION file."
[agent]
final = {json.dumps(final)}
{agent}
{plan}
[budget]
max_tool_calls = 10
{budget}
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "deny"
reason = "no writes in this test"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "broken", "write"]
{extra_checks}
[[done.checks]]
kind = "panel"
quorum = {quorum}
{panel}
{reviewers}
"""


def _inline(arguments: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in arguments.items()) + " }"


def scripted_reviewer(*, judge: str | None = None, answer: Any = None, stall: bool = False, name: str = "") -> str:
    lines = ["[[done.checks.reviewers]]", 'provider = "scripted"']
    if name:
        lines.append(f"name = {json.dumps(name)}")
    if judge is not None:
        lines.append(f"judge = {json.dumps(judge)}")
    if answer is not None:
        lines.append(f"answer = {_toml_value(answer)}")
    if stall:
        lines.append("stall = true")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"  # pyright: ignore[reportUnknownVariableType]
    return json.dumps(value)


def approving(claims: int, calls: list[str]) -> dict[str, Any]:
    """A valid form that finds every one of ``claims`` claims supported by ``calls``."""
    return {"claims": [{"claim": i, "judgement": "supported", "calls": calls} for i in range(claims)]}


async def run(
    tmp_path: Path,
    text: str,
    *,
    environ: Mapping[str, str] | None = None,
    session: str = SESSION,
    plan: bool = True,
) -> tuple[RunOutcome, SqliteStore]:
    """A whole run in-process; ``plan=False`` runs the agent the contract names instead of its plan."""
    store, key = new_store(tmp_path)
    runtime = Runtime(
        store=store,
        key=key,
        clock=ManualClock(),
        home=tmp_path,
        environ=dict(environ or {}),
        connector=fake_connector(transport()),
        provider=scripted() if plan else None,
    )
    outcome = await run_contract(runtime, contract_from(text), session_id=session)
    return outcome, store


def panel_of(outcome: RunOutcome, index: int = 0) -> dict[str, Any]:
    """The ``panel`` member of the verdict's check ``index``."""
    assert outcome.verdict is not None
    check: dict[str, Any] = outcome.verdict["checks"][index]
    return dict(check["panel"])


def reviews(store: SqliteStore, session: str = SESSION) -> list[StoredEntry]:
    return [e for e in store.read_session(session) if e.kind == "panel_review"]
