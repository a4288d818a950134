"""A done check's ``select`` says which calls of its tool it looks at: ``last`` (the default),
``first``, ``any``, ``all`` or one call by id. One run (three calls of one tool: a success with
``n = 1``, an error result, a success with ``n = 3``) is judged by every selection at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import fake_connector, new_store
from truss import ContractError
from truss.contract import load_contract_text
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

HEAD = """
[contract]
name = "select"
intent = "count three times"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["count"]
[[agent.steps]]
tool = "mcp:srv:count"
arguments = { n = 1 }
[[agent.steps]]
tool = "mcp:srv:count"
arguments = { fail = true }
[[agent.steps]]
tool = "mcp:srv:count"
arguments = { n = 3 }
"""

# (kind, select, what it expects) -> whether the check holds for the run above
CASES: list[tuple[str, str | None, bool]] = [
    ("tool_succeeded", None, True),
    ("tool_succeeded", "last", True),
    ("tool_succeeded", "first", True),
    ("tool_succeeded", "any", True),
    ("tool_succeeded", "all", False),
    ("tool_succeeded", "call:c1.0", True),
    ("tool_succeeded", "call:c2.0", False),
    ("tool_succeeded", "call:c9.0", False),
    ("result_matches", None, True),
    ("result_matches", "last", True),
    ("result_matches", "first", False),
    ("result_matches", "any", True),
    ("result_matches", "all", False),
    ("result_matches", "call:c3.0", True),
    ("result_matches", "call:c1.0", False),
    ("result_matches", "call:c2.0", False),
]


def _check(kind: str, select: str | None) -> str:
    text = f'[[done.checks]]\nkind = "{kind}"\ntool = "mcp:srv:count"\n'
    if select is not None:
        text += f'select = "{select}"\n'
    if kind == "result_matches":
        text += 'pointer = "/n"\nequals = 3\n'
    return text


async def _handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    if arguments.get("fail"):
        return text_result("no", is_error=True)
    return text_result("counted", structured={"n": arguments["n"]})


@pytest.mark.anyio
async def test_each_selection_looks_at_the_calls_it_names(tmp_path: Path) -> None:
    contract = load_contract_text(HEAD + "".join(_check(k, s) for k, s, _ in CASES), source="c.toml")
    fake = FakeTransport(_handler, tools=[mounted_tool("srv", "count")])
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    with anyio.fail_after(30):
        outcome = await run_contract(
            Runtime(store=store, key=key, clock=clock, home=tmp_path / "h", environ={}, connector=fake_connector(fake)),
            contract,
        )
    calls = [e.body["call"] for e in store.read_session(outcome.session) if e.kind == "mcp_tool_call"]
    assert calls == ["c1.0", "c2.0", "c3.0"]
    assert outcome.verdict is not None
    checks: list[dict[str, Any]] = outcome.verdict["checks"]
    got: list[tuple[str, str | None, bool]] = [(c["kind"], CASES[c["index"]][1], c["ok"]) for c in checks]
    assert got == CASES


@pytest.mark.parametrize(
    ("kind", "select"),
    [("tool_succeeded", "latest"), ("tool_succeeded", "call:"), ("result_matches", "2"), ("final_matches", "last")],
)
def test_a_select_that_names_nothing_or_a_kind_without_select_is_refused_at_load(kind: str, select: str) -> None:
    check = f'[[done.checks]]\nkind = "{kind}"\nselect = "{select}"\nregex = "x"\n'
    if kind != "final_matches":
        check += 'tool = "mcp:srv:count"\n'
    with pytest.raises(ContractError) as caught:
        load_contract_text(HEAD + check, source="c.toml")
    assert str(caught.value.fields["path"]).startswith("done.checks[0]")
