"""Property: whatever JSON a server answers a call with (any depth, integers of any size, floats
including NaN and the infinities, any strings including lone surrogates, any size), the run
reaches a verdict, the call is on the record, and the ledger verifies.

Each example is a real stdio server (``servers/answers.py`` playing one generated line) and a real
run through the MCP client tier; the answer is JSON *text*, so it can hold what Python's JSON
writer never produces (``1e400``, ``NaN``, ``\\ud800``, 300 levels of nesting).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.gate.support import contract_from, new_store
from tests.security._support import HERE
from truss._clock import SystemClock
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_ledger
from truss.mcp.client import connect
from truss.runtime import Runtime
from truss.session import run_contract

ANSWERS = HERE / "servers" / "answers.py"

_scalars = st.one_of(
    st.none().map(lambda _: "null"),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.integers().map(str),
    st.sampled_from(["18446744073709551616", "-9007199254740993", "1e400", "-1e400", "NaN", "Infinity", "-0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.text(max_size=40).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.text(max_size=10).map(lambda t: json.dumps(t)[:-1] + '\\ud800"'),
    st.integers(0, 3_000).map(lambda n: json.dumps("x" * n)),
)


def _container(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arrays = st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
    objects = st.lists(st.tuples(st.text(max_size=8), children), max_size=4).map(
        lambda pairs: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"
    )
    return arrays | objects


_values = st.recursive(_scalars, _container, max_leaves=12)


@st.composite
def answers(draw: st.DrawFn) -> str:
    """One JSON-RPC answer line to a ``tools/call`` with id ``${ID}``."""
    value = draw(_values)
    depth = draw(st.sampled_from([0, 0, 1, 5, 119, 126, 127, 190, 250, 300]))
    nested = "[" * depth + value + "]" * depth
    where = draw(st.sampled_from(["structured", "result", "text", "big"]))
    if where == "structured":
        result = '{"content":[{"type":"text","text":"t"}],"structuredContent":{"v":' + nested + "}}"
    elif where == "result":
        result = nested
    elif where == "text":
        result = '{"content":[{"type":"text","text":' + json.dumps(draw(st.text(max_size=200))) + "}]}"
    else:
        size = draw(st.integers(0, 60_000))
        result = '{"content":[{"type":"text","text":"' + "y" * size + '"}],"structuredContent":{"v":' + value + "}}"
    return '{"jsonrpc":"2.0","id":${ID},"result":' + result + "}"


CONTRACT = """
[contract]
name = "any-answer"
intent = "take whatever the server says"
[budget]
call_timeout = "20s"
max_result_bytes = 40000
[[agent.steps]]
tool = "mcp:any:echo"
arguments = {{ text = "hi" }}
[[mcp.servers]]
name = "any"
command = {python}
args = {args}
allow_tools = ["echo"]
connect_timeout = "20s"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:any:echo"
"""


def _structured(value: str) -> str:
    return '{"jsonrpc":"2.0","id":${ID},"result":{"content":[],"structuredContent":{"v":' + value + "}}}"


@pytest.mark.slow
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=answers())
@example(line=_structured("[" * 126 + "1" + "]" * 126))  # recordable now, not inside the next model turn
@example(line=_structured("[" * 250 + "1" + "]" * 250))  # past the parser: dropped, and the call waited
@example(line=_structured("1e400"))  # infinity, turned into null by the JSON dump
@example(line=_structured("NaN"))
def test_any_answer_a_server_sends_reaches_a_verdict_and_the_ledger_verifies(tmp_path: Path, line: str) -> None:
    spec = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}], "answers": {"echo": {"raw": line}}}
    data = tmp_path / "answer.json"
    data.write_text(json.dumps(spec), encoding="utf-8")
    contract = contract_from(
        CONTRACT.format(python=json.dumps(sys.executable), args=json.dumps([str(ANSWERS), str(data)]))
    )
    clock = SystemClock()
    store, key = new_store(tmp_path)  # one ledger for every example: each is a session of its own

    async def main() -> Any:
        with anyio.fail_after(60):
            runtime = Runtime(store=store, key=key, clock=clock, home=tmp_path / "home", environ={}, connector=connect)
            return await run_contract(runtime, contract)

    try:
        outcome = anyio.run(main)
        assert outcome.status in ("pass", "fail", "error")
        entries = list(store.read_session(outcome.session))
        assert [e.kind for e in entries][-2:] == ["verdict", "session_ended"]
        assert [e for e in entries if e.kind == "mcp_tool_call"], "the call is on the record"
        assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok
    finally:
        store.close()
