"""Providers and done-check kinds come from registries: a test plugs one of each in, unknown names are refused.

The end-to-end cases run a whole contract through ``run_contract`` with nothing but the default
registries: the kind or provider registered here is found by the loader (the contract loads), by
the session (``make_provider``) and by the verdict, exactly as Truss's own are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from tests.gate.support import fake_connector, new_store
from truss import ContractError, InputError
from truss.contract import (
    DONE_CHECKS,
    PROVIDER_KINDS,
    Checked,
    CheckKind,
    Contract,
    DoneCheck,
    Evidence,
    ProviderCapabilities,
    ProviderKind,
    load_contract_text,
    validation_context,
)
from truss.providers import PROVIDERS, Provider, ProviderEnv, ProviderRegistry, TurnRequest, TurnResponse, make_provider
from truss.providers.base import ToolCall
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult
from truss.verdict import evaluate

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"

SERVER = """
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["count"]
"""

TWO_COUNTS = f"""
[contract]
name = "registry-test"
intent = "count twice"
[[agent.steps]]
tool = "mcp:srv:count"
[[agent.steps]]
tool = "mcp:srv:count"
{SERVER}
"""


def called_times(check: DoneCheck, evidence: Evidence) -> Checked:
    seen = len(evidence.calls_of(check.tool))
    return Checked(seen == check.equals, f"{check.tool} was called {seen} time(s)")


def a_whole_number(check: DoneCheck) -> str | None:
    ok = isinstance(check.equals, int) and not isinstance(check.equals, bool) and check.equals >= 0
    return None if ok else "a called_times check needs equals = a whole number of calls"


CALLED_TIMES = CheckKind("called_times", called_times, needs_tool=True, needs_match=True, validate=a_whole_number)


def check(kind: str, extra: str = "") -> str:
    return f'\n[[done.checks]]\nkind = "{kind}"\ntool = "mcp:srv:count"\n{extra}\n'


async def run(contract: Contract, tmp_path: Path) -> tuple[RunOutcome, FakeTransport]:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result("counted")

    fake = FakeTransport(handler, tools=[mounted_tool("srv", "count")])
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


# -- done-check kinds ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_done_check_kind_registered_from_a_test_decides_the_verdict_of_a_run(tmp_path: Path) -> None:
    with DONE_CHECKS.registered(CALLED_TIMES):
        passing = load_contract_text(TWO_COUNTS + check("called_times", "equals = 2"), source="c.toml")
        failing = load_contract_text(TWO_COUNTS + check("called_times", "equals = 3"), source="c.toml")
        passed, fake = await run(passing, tmp_path / "pass")
        failed, _ = await run(failing, tmp_path / "fail")
    assert len(fake.calls) == 2
    assert (passed.status, passed.exit_code) == ("pass", 0)
    assert passed.verdict is not None and passed.verdict["checks"][0]["kind"] == "called_times"
    assert (failed.status, failed.exit_code) == ("fail", 1)
    assert failed.verdict is not None and failed.verdict["checks"][0]["ok"] is False


def test_a_registered_kind_checks_its_own_keys_at_load() -> None:
    with DONE_CHECKS.registered(CALLED_TIMES), pytest.raises(ContractError) as caught:
        load_contract_text(TWO_COUNTS + check("called_times", 'equals = "two"'), source="c.toml")
    assert caught.value.fields["path"] == "done.checks[0]"
    with DONE_CHECKS.registered(CALLED_TIMES), pytest.raises(ContractError) as caught:
        load_contract_text(TWO_COUNTS + '\n[[done.checks]]\nkind = "called_times"\nequals = 1\n', source="c.toml")
    assert caught.value.fields["path"] == "done.checks[0]"  # needs_tool


def test_an_unknown_done_check_kind_is_refused_at_load_with_its_key_path_and_line() -> None:
    text = TWO_COUNTS + check("tool_succeded")
    with pytest.raises(ContractError) as caught:
        load_contract_text(text, source="c.toml")
    assert caught.value.fields["path"] == "done.checks[0].kind"
    assert caught.value.fields["line"] == text.splitlines().index('kind = "tool_succeded"') + 1


def test_a_kind_in_a_private_registry_loads_only_with_that_registry() -> None:
    kinds = DONE_CHECKS.copy()
    kinds.register(CALLED_TIMES)
    text = TWO_COUNTS + check("called_times", "equals = 2")
    loaded = load_contract_text(text, source="c.toml", checks=kinds)
    assert loaded.done.checks[0].kind == "called_times"
    assert "called_times" not in DONE_CHECKS
    with pytest.raises(ContractError) as caught:
        load_contract_text(text, source="c.toml")
    assert caught.value.fields["path"] == "done.checks[0].kind"
    # A recorded effective contract is read back the same way: with the registry, or not at all.
    recorded = loaded.to_json()
    assert Contract.model_validate(recorded, context=validation_context(checks=kinds)) == loaded
    with pytest.raises(ValidationError):
        Contract.model_validate(recorded)


def test_a_check_whose_kind_has_no_evaluation_fails_the_verdict_and_never_passes() -> None:
    kinds = DONE_CHECKS.copy()
    kinds.register(CALLED_TIMES)
    contract = load_contract_text(TWO_COUNTS + check("called_times", "equals = 0"), source="c.toml", checks=kinds)
    # Evaluated against the default registry, which has no such kind: the check fails, naming it.
    verdict = evaluate(contract, [], lambda ref: None, final_text="done")
    assert verdict.status == "fail"
    assert [(c.kind, c.ok) for c in verdict.checks] == [("called_times", False)]
    assert evaluate(contract, [], lambda ref: None, final_text="done", kinds=kinds).status == "pass"


def test_a_kind_whose_evaluation_raises_fails_its_check_and_the_verdict_is_still_given() -> None:
    def broken(check: DoneCheck, evidence: Evidence) -> Checked:
        raise ZeroDivisionError

    kinds = DONE_CHECKS.copy()
    kinds.register(CheckKind("broken", broken))
    contract = load_contract_text(TWO_COUNTS + '\n[[done.checks]]\nkind = "broken"\n', source="c.toml", checks=kinds)
    verdict = evaluate(contract, [], lambda ref: None, final_text=None, kinds=kinds)
    assert verdict.status == "fail"
    assert verdict.checks[0].ok is False and "ZeroDivisionError" in verdict.checks[0].detail


# -- providers --------------------------------------------------------------------------------------


class CountingModel:
    """A provider that is not Truss's: it calls the count tool once, then answers."""

    name = "counting-model"
    capabilities = ProviderCapabilities(needs_model=False)

    def __init__(self, contract: Contract) -> None:
        self.intent = contract.contract.intent

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        if request.turn == 1:
            call = ToolCall(id="c1", name="mcp__srv__count", arguments={})
            return TurnResponse(text="", tool_calls=[call], stop_reason="tool_use")
        return TurnResponse(text=f"done: {self.intent}")

    async def aclose(self) -> None:
        return None


def counting_model(contract: Contract, env: ProviderEnv) -> Provider:
    return CountingModel(contract)


COUNTING = ProviderKind("counting-model", ProviderCapabilities(needs_model=False), "a test's model")

BY_MODEL = f"""
[contract]
name = "registry-test"
intent = "count once"
[agent]
provider = "counting-model"
{SERVER}
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:count"
[[done.checks]]
kind = "final_matches"
regex = "^done: count once$"
"""


@pytest.mark.anyio
async def test_a_provider_registered_from_a_test_runs_a_contract_end_to_end(tmp_path: Path) -> None:
    with PROVIDERS.registered(COUNTING, counting_model):
        contract = load_contract_text(BY_MODEL, source="c.toml")
        outcome, fake = await run(contract, tmp_path)
    assert (outcome.status, outcome.exit_code) == ("pass", 0), outcome.reason
    assert [c.tool for c in fake.calls] == ["mcp:srv:count"]
    assert "counting-model" not in PROVIDER_KINDS


def test_an_unknown_provider_is_refused_at_load_with_its_key_path_and_line() -> None:
    with pytest.raises(ContractError) as caught:
        load_contract_text(BY_MODEL, source="c.toml")
    assert caught.value.fields["path"] == "agent.provider"
    assert caught.value.fields["line"] == BY_MODEL.splitlines().index('provider = "counting-model"') + 1


def test_a_provider_kind_that_needs_a_model_refuses_a_contract_without_one() -> None:
    needy = ProviderKind("counting-model", ProviderCapabilities(needs_model=True))
    with PROVIDERS.registered(needy, counting_model), pytest.raises(ContractError) as caught:
        load_contract_text(BY_MODEL, source="c.toml")
    assert caught.value.fields["path"] == "agent"


def test_a_provider_with_a_kind_but_no_factory_is_refused_when_built_not_replaced() -> None:
    registry = PROVIDERS.copy()
    registry.kinds.register(COUNTING)
    contract = load_contract_text(BY_MODEL, source="c.toml", providers=registry.kinds)
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={}, clock=ManualClock(), registry=registry)
    assert caught.value.fields["provider"] == "counting-model"
    with pytest.raises(InputError):  # and the default registry does not know it at all
        make_provider(contract, environ={}, clock=ManualClock())


def test_a_private_provider_registry_leaves_the_default_one_alone() -> None:
    registry = PROVIDERS.copy()
    registry.register(COUNTING, counting_model)
    contract = load_contract_text(BY_MODEL, source="c.toml", providers=registry.kinds)
    assert isinstance(make_provider(contract, environ={}, clock=ManualClock(), registry=registry), CountingModel)
    assert "counting-model" not in PROVIDERS.kinds


def test_truss_registers_a_factory_for_every_provider_kind_it_declares() -> None:
    assert PROVIDERS.kinds is PROVIDER_KINDS
    assert PROVIDER_KINDS.names() == ("anthropic", "openai", "scripted")
    assert all(PROVIDERS.factory(name) is not None for name in PROVIDER_KINDS.names())


# -- the registries themselves ----------------------------------------------------------------------


def test_a_name_is_registered_once_unless_replaced() -> None:
    registry = ProviderRegistry()
    registry.register(COUNTING, counting_model)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(COUNTING, counting_model)
    with pytest.raises(ValueError, match="already registered"):
        registry.kinds.register(ProviderKind("counting-model", ProviderCapabilities()))
    registry.register(ProviderKind("counting-model", ProviderCapabilities()), counting_model, replace=True)
    assert registry.kinds.require("counting-model").capabilities.needs_model


@pytest.mark.parametrize("name", ["", "Upper", "1st", "has space", "x" * 65, "mcp:srv"])
def test_a_name_that_a_contract_could_not_spell_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        DONE_CHECKS.copy().register(CheckKind(name, called_times))


def test_a_kind_registered_for_a_block_is_gone_after_it_even_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), DONE_CHECKS.registered(CALLED_TIMES):
        assert "called_times" in DONE_CHECKS
        raise RuntimeError
    assert "called_times" not in DONE_CHECKS
    with pytest.raises(LookupError):
        DONE_CHECKS.require("called_times")


@pytest.mark.parametrize("name", DONE_CHECKS.names())
def test_every_done_check_kind_truss_registers_has_a_row_in_the_reference(name: str) -> None:
    assert f"| `{name}` |" in (DOCS / "contracts.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PROVIDER_KINDS.names())
def test_every_provider_truss_registers_has_a_row_in_the_providers_page(name: str) -> None:
    assert f"| `{name}`" in (DOCS / "providers.md").read_text(encoding="utf-8")
