"""Every contract shipped in ``contracts/`` loads, renders, and shows as TOML and JSON."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from truss.contract import Contract, load_contract, render_arguments, render_intent
from truss.policy import lint

CONTRACTS = Path(__file__).resolve().parent.parent.parent / "contracts"
FILES = sorted(CONTRACTS.glob("*.toml"))


def test_contracts_directory_holds_the_documented_examples() -> None:
    names = {p.name for p in FILES}
    assert {"hello.toml", "git-triage.toml", "model-openai.toml", "full-reference.toml"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_contract_loads_and_renders(path: Path) -> None:
    contract = load_contract(path)
    assert contract.contract.name == path.stem
    assert contract.hash.startswith("sha256:")
    environ = {"REPO": ".", "USER": "someone"}
    assert "${params." not in render_intent(contract, environ)
    for step in contract.agent.steps:
        rendered = render_arguments(step.arguments, params=contract.param_values, environ=environ)
        assert "${params." not in repr(rendered) and "${env." not in repr(rendered)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_contract_round_trips_through_its_json_form(path: Path) -> None:
    contract = load_contract(path)
    again = Contract.model_validate(contract.to_json())
    assert again.hash == contract.hash


def test_hello_plans_get_current_time_then_convert_time_from_its_result() -> None:
    contract = load_contract(CONTRACTS / "hello.toml")
    assert [s.tool for s in contract.agent.steps] == ["mcp:time:get_current_time", "mcp:time:convert_time"]
    second = render_arguments(contract.agent.steps[1].arguments, params=contract.param_values, environ={})
    assert second["source_timezone"] == "${steps.0.result/timezone}"
    assert second["target_timezone"] == "Asia/Tokyo"
    server = contract.mcp.servers[0]
    assert (server.command, server.args) == ("mcp-server-time", ["--local-timezone", "UTC"])


def test_git_triage_denies_writes_even_when_the_allowlist_is_widened() -> None:
    contract = load_contract(CONTRACTS / "git-triage.toml")
    assert contract.policy.default == "deny"
    for write in ("git_reset", "git_commit", "git_add", "git_checkout", "git_create_branch"):
        assert write not in contract.mcp.servers[0].allow_tools
        allowing = [r for r in contract.policy.rules if fnmatchcase(f"mcp:git:{write}", r.tool) and r.effect != "deny"]
        assert not allowing, write


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_contract_policy_has_no_lint_findings(path: Path) -> None:
    assert lint(load_contract(path)) == []
