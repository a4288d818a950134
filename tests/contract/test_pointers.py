"""One strict RFC 6901 resolver for plans and done checks: each file in ``pointers/`` is a pointer a resolver got wrong.

Each case is run where a user meets it: as a ``result_matches`` done check (a wrong resolver
passes a check on the wrong element, or crashes the verdict) and as a ``${steps.N.result/...}``
reference in a scripted plan (a wrong resolver sends the wrong value to the next tool). Both must
agree: found and the same value, or not found (the check fails; the plan stops before the call).
An invalid pointer (a ``~`` that is not ``~0``/``~1``) is refused when the contract loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import truss.providers
import truss.verdict
from tests.gate.support import fake_connector, new_store
from truss import ContractError
from truss._pointer import resolve_pointer
from truss.contract import Contract, load_contract_text
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

CASES = sorted((Path(__file__).parent / "pointers").glob("*.json"))


def case(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


SERVER = """
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["doc", "echo"]
"""


async def run(contract: Contract, document: Any, tmp_path: Path) -> tuple[RunOutcome, FakeTransport]:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        if tool.tool == "doc":
            return text_result("the document", structured=document)
        return text_result("echoed")

    fake = FakeTransport(handler, tools=[mounted_tool("srv", "doc"), mounted_tool("srv", "echo")])
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    with anyio.fail_after(30):
        outcome = await run_contract(
            Runtime(
                store=store, key=key, clock=clock, home=tmp_path / "home", environ={}, connector=fake_connector(fake)
            ),
            contract,
        )
    return outcome, fake


def test_every_resolver_in_truss_is_the_one_resolver() -> None:
    assert truss.verdict.resolve_pointer is resolve_pointer
    assert truss.providers.resolve_pointer is resolve_pointer


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_resolver_finds_exactly_what_rfc_6901_points_at(path: Path) -> None:
    c = case(path)
    assert resolve_pointer(c["document"], c["pointer"]) == (c["found"], c["value"])


@pytest.mark.anyio
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
async def test_a_done_check_pointer_finds_what_the_resolver_finds_or_fails(path: Path, tmp_path: Path) -> None:
    c = case(path)
    expected = f"equals = {json.dumps(c['value'])}" if c["found"] else 'regex = ""'  # "" matches anything found
    text = f"""
[contract]
name = "pointer-check"
intent = "read a document"
[[agent.steps]]
tool = "mcp:srv:doc"
{SERVER}
[[done.checks]]
kind = "result_matches"
tool = "mcp:srv:doc"
pointer = {json.dumps(c["pointer"])}
{expected}
"""
    if not c["valid"]:
        with pytest.raises(ContractError) as caught:
            load_contract_text(text, source="c.toml")
        assert caught.value.fields["path"] == "done.checks[0].pointer"
        return
    outcome, _ = await run(load_contract_text(text, source="c.toml"), c["document"], tmp_path)
    assert outcome.status == ("pass" if c["found"] else "fail"), outcome.reason


@pytest.mark.anyio
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
async def test_a_plan_reference_finds_what_the_resolver_finds_or_stops_the_plan(path: Path, tmp_path: Path) -> None:
    c = case(path)
    reference = json.dumps("${steps.0.result" + c["pointer"] + "}")
    text = f"""
[contract]
name = "pointer-plan"
intent = "pass a value on"
[[agent.steps]]
tool = "mcp:srv:doc"
[[agent.steps]]
tool = "mcp:srv:echo"
arguments = {{ value = {reference} }}
{SERVER}
"""
    outcome, fake = await run(load_contract_text(text, source="c.toml"), c["document"], tmp_path)
    echoed = [call.arguments for call in fake.calls if call.tool == "mcp:srv:echo"]
    assert echoed == ([{"value": c["value"]}] if c["found"] else []), outcome.reason


# -- properties of the one resolver (hypothesis) ---------------------------------------------------

_keys = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
_documents = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


@settings(max_examples=200, deadline=None)
@given(_documents, st.data())
def test_a_pointer_built_from_a_path_by_rfc_6901_finds_the_value_at_that_path(document: Any, data: Any) -> None:
    pointer: str = ""
    value: Any = document
    while isinstance(value, dict | list) and value and data.draw(st.booleans()):
        if isinstance(value, dict):
            mapping = cast(dict[str, Any], value)
            key = data.draw(st.sampled_from(sorted(mapping)))
            pointer, value = f"{pointer}/{_escape(key)}", mapping[key]
        else:
            items = cast(list[Any], value)
            index = data.draw(st.integers(0, len(items) - 1))
            pointer, value = f"{pointer}/{index}", items[index]
    assert resolve_pointer(document, pointer) == (True, value)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(), min_size=1, max_size=12),
    st.sampled_from(["-", "01", "+1", "-1", " 1", "1 ", "1.0", "0x1", "١", "۱", "१", "１", "1e0"]),
)
def test_an_array_index_that_is_not_ascii_digits_without_a_leading_zero_never_resolves(
    items: list[int], token: str
) -> None:
    assert resolve_pointer(items, f"/{token}") == (False, None)
    assert resolve_pointer({"a": items}, f"/a/{token}") == (False, None)
