"""On resume the loop asks the provider what it can do, never its name: a plan is re-asked, a model is not.

A provider whose capabilities say it plays a fixed plan is asked again for every recorded turn
(it costs nothing) and a different answer stops the resume as a divergence; any other provider
is never asked again for a recorded turn. The providers here are called ``planner``, not
``scripted``, and the contract names ``scripted``: only the capability decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import calls, contract_from, fake_connector, new_store
from truss.contract import ProviderCapabilities
from truss.providers.base import TurnRequest, TurnResponse
from truss.runtime import Runtime
from truss.session import RunOutcome, approve_call, resume_session, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

TEXT = """
[contract]
name = "capabilities-test"
intent = "write after asking"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["write"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:write"
"""

WRITE = "mcp__srv__write"


class Planner:
    name = "planner"

    def __init__(self, path: str, *, plays_plan: bool) -> None:
        self.capabilities = ProviderCapabilities(plays_plan=plays_plan, needs_model=False)
        self.path = path
        self.asked: list[int] = []

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        self.asked.append(request.turn)
        if request.turn == 1:
            return calls((WRITE, {"path": self.path}))
        return TurnResponse("written")

    async def aclose(self) -> None:
        return None


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = ManualClock()
        self.store, self.key = new_store(tmp_path, self.clock)
        self.home = tmp_path / "home"
        self.transport = FakeTransport(_ok, tools=[mounted_tool("srv", "write")])

    async def run(self, provider: Planner) -> RunOutcome:
        with anyio.fail_after(20):
            return await run_contract(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=fake_connector(self.transport),
                    provider=lambda _contract: provider,
                ),
                contract_from(TEXT),
            )

    async def resume(self, session: str, provider: Planner) -> RunOutcome:
        with anyio.fail_after(20):
            return await resume_session(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=fake_connector(self.transport),
                    provider=lambda _contract: provider,
                ),
                session,
            )

    async def suspended(self, provider: Planner) -> str:
        first = await self.run(provider)
        assert first.status == "suspended" and first.waiting == ("c1.0",)
        approve_call(Runtime(self.store, key=self.key), first.session, "c1.0", approved=True)
        return first.session


async def _ok(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result("ok")


async def test_a_provider_that_plays_a_plan_is_asked_again_for_a_recorded_turn_and_may_agree(tmp_path: Path) -> None:
    w = World(tmp_path)
    session = await w.suspended(Planner("a", plays_plan=True))
    again = Planner("a", plays_plan=True)
    outcome = await w.resume(session, again)
    assert outcome.status == "pass", outcome.reason
    assert again.asked == [1, 2]
    assert [c.arguments for c in w.transport.calls] == [{"path": "a"}]


async def test_a_plan_that_answers_a_recorded_turn_differently_diverges_and_calls_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    session = await w.suspended(Planner("a", plays_plan=True))
    outcome = await w.resume(session, Planner("b", plays_plan=True))
    assert (outcome.status, outcome.exit_code) == ("diverged", 4)
    assert w.transport.calls == []


async def test_a_provider_that_does_not_play_a_plan_is_never_asked_again_for_a_recorded_turn(tmp_path: Path) -> None:
    w = World(tmp_path)
    session = await w.suspended(Planner("a", plays_plan=False))
    model = Planner("b", plays_plan=False)  # would answer differently, but is not asked
    outcome = await w.resume(session, model)
    assert outcome.status == "pass", outcome.reason
    assert model.asked == [2]
    assert [c.arguments for c in w.transport.calls] == [{"path": "a"}]
