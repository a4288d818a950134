"""How model turns are recorded: request deltas chained by hash, linear in the run, rebuilt exactly."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import ListProvider, calls, contract_from, fake_connector, new_store, scripted
from truss._errors import VerificationError
from truss.contract import Contract
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.stores.sqlite import SqliteStore
from truss.ledger.verification import verify_entries
from truss.providers.base import Provider, TurnResponse
from truss.runtime import Runtime
from truss.session import RunOutcome, approve_call, resume_session, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult
from truss.turns import RequestFold, rebuild_request

pytestmark = pytest.mark.anyio

TEXT = """
[contract]
name = "turn-recording"
intent = "echo some text, then write it"
[agent]
max_turns = 500
{steps}
[budget]
max_tool_calls = 500
max_model_turns = 500
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["echo", "write"]
"""

ECHO, WRITE = "mcp__srv__echo", "mcp__srv__write"


class World:
    def __init__(self, tmp_path: Path, steps: int = 0) -> None:
        self.clock = ManualClock()
        self.store: SqliteStore
        self.key: IdentityKey
        self.store, self.key = new_store(tmp_path, self.clock)
        self.home = tmp_path / "home"
        plan = "".join(
            f'[[agent.steps]]\ntool = "mcp:srv:echo"\narguments = {{ text = "step {i:05d}" }}\n' for i in range(steps)
        )
        self.contract: Contract = contract_from(TEXT.format(steps=plan))
        self.call_seconds = 0.0

        async def echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
            self.clock.advance(self.call_seconds)
            return text_result(f"{tool.tool}: {arguments.get('text')}", structured=dict(arguments))

        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        self.transport = FakeTransport(
            echo, tools=[mounted_tool("srv", "echo", input_schema=schema), mounted_tool("srv", "write")]
        )

    async def run(self, provider: Any) -> RunOutcome:
        with anyio.fail_after(30):
            return await run_contract(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=fake_connector(self.transport),
                    provider=provider,
                ),
                self.contract,
            )

    async def resume(self, session: str, provider: Any) -> RunOutcome:
        with anyio.fail_after(30):
            return await resume_session(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=fake_connector(self.transport),
                    provider=provider,
                ),
                session,
            )

    def turns(self, session: str) -> list[Mapping[str, Any]]:
        return [e.body for e in self.store.read_session(session) if e.kind == "model_turn"]

    def request_bytes(self, session: str) -> int:
        """The bytes stored for the requests of every model turn: the deltas and the tool lists."""
        refs = {str(b["request"]) for b in self.turns(session)} | {str(b["tools"]) for b in self.turns(session)}
        return sum(len(self.store.blob(ref) or b"") for ref in refs)


def fixed(model: ListProvider) -> Any:
    def make(_contract: Contract) -> Provider:
        return model

    return make


async def test_request_bytes_of_a_scripted_run_grow_linearly_with_its_turns(tmp_path: Path) -> None:
    sizes: dict[int, int] = {}
    for n in (40, 80):
        world = World(tmp_path / str(n), steps=n)
        outcome = await world.run(scripted())
        assert outcome.status == "pass" and len(world.turns(outcome.session)) == n + 1
        sizes[n] = world.request_bytes(outcome.session)
    # Storing the whole conversation at every turn stores well over 3x the bytes for twice the turns.
    assert sizes[80] < 2.2 * sizes[40], sizes


async def test_every_recorded_request_rebuilds_to_what_the_provider_was_sent(tmp_path: Path) -> None:
    world = World(tmp_path)
    model = ListProvider(
        [
            calls((ECHO, {"text": "a"})),
            calls((ECHO, {"text": "b"}), ("mcp__srv__nope", {}), (ECHO, None)),
            TurnResponse("done"),
        ]
    )
    outcome = await world.run(fixed(model))
    assert outcome.status == "fail"  # no done checks and a call (to nope) denied: an honest verdict
    turns = world.turns(outcome.session)
    assert len(turns) == len(model.requests) == 3
    fold = RequestFold(world.store.blob)
    for body, sent in zip(turns, model.requests, strict=True):
        expected = json.loads(canonical(sent.to_json()))
        assert rebuild_request(str(body["request"]), world.store.blob) == expected
        assert fold.add(str(body["request"])) == expected
    first = json.loads(world.store.blob(str(turns[0]["request"])) or b"")
    later = json.loads(world.store.blob(str(turns[2]["request"])) or b"")
    assert first["prev"] is None and "system" in first and len(first["append"]) == 1
    assert later["prev"] == turns[1]["request"] and "system" not in later
    assert len(later["append"]) == 4  # the assistant turn and its three tool results, nothing older


async def test_after_resume_the_new_turns_request_rebuilds_to_what_the_provider_was_sent(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.call_seconds = 7.0  # live calls take time; replayed ones do not, so the budget notes differ
    model = ListProvider(
        [calls((ECHO, {"text": "a"})), calls((ECHO, {"text": "b"}), (WRITE, {"text": "c"})), TurnResponse("ok")]
    )
    first = await world.run(fixed(model))
    assert first.status == "suspended"
    approve_call(Runtime(world.store, key=world.key), first.session, "c2.1", approved=True)
    second = await world.resume(first.session, fixed(model))
    assert second.status == "pass"
    turns = world.turns(first.session)
    assert len(turns) == 3 and len(model.requests) == 3  # turns 1 and 2 came from the ledger
    rebuilt = rebuild_request(str(turns[2]["request"]), world.store.blob)
    assert rebuilt == json.loads(canonical(model.requests[2].to_json()))
    report = verify_entries(
        world.store.read_session(first.session), TrustedKeys([world.key.verifier]), blobs=world.store.blob
    )
    assert report.ok, report


async def test_a_request_chain_that_skips_a_turn_does_not_rebuild(tmp_path: Path) -> None:
    world = World(tmp_path)
    model = ListProvider([calls((ECHO, {"text": "a"})), calls((ECHO, {"text": "b"})), TurnResponse("done")])
    outcome = await world.run(fixed(model))
    turns = world.turns(outcome.session)
    blobs = {str(t["request"]): world.store.blob(str(t["request"])) or b"" for t in turns}
    third = json.loads(blobs[str(turns[2]["request"])])
    third["prev"] = turns[0]["request"]  # splice turn 1 in where turn 2 was
    forged = canonical(third)
    blobs[sha256_ref(forged)] = forged

    def read(ref: str) -> bytes | None:
        return blobs.get(ref) or world.store.blob(ref)

    with pytest.raises(VerificationError) as caught:
        rebuild_request(sha256_ref(forged), read)
    assert caught.value.fields["reason"] == "bad_request_chain"


async def test_a_request_whose_payload_was_erased_is_not_rebuilt(tmp_path: Path) -> None:
    world = World(tmp_path)
    model = ListProvider([calls((ECHO, {"text": "a"})), TurnResponse("done")])
    outcome = await world.run(fixed(model))
    turns = world.turns(outcome.session)
    world.store.erase_payloads(outcome.session)
    assert rebuild_request(str(turns[1]["request"]), world.store.blob) is None
