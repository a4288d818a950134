"""Params are typed and checked; ${params.X}/${env.X} are rendered at run time, only where allowed."""

from __future__ import annotations

from typing import Any

import pytest

from truss import ContractError, InputError, UsageError
from truss.contract import (
    Contract,
    ParamSpec,
    load_contract_text,
    narrow_budget,
    parse_param_args,
    render_arguments,
    render_intent,
)

TEXT = """
[contract]
name = "params"
intent = "Deploy ${params.service} x${params.replicas} (dry ${params.dry_run}) as ${env.DEPLOYER}."

[contract.params]
service = { type = "string", max_len = 10, regex = "^[a-z]+$" }
replicas = { type = "integer", min = 1, max = 5, default = 2 }
ratio = { type = "number", min = 0, max = 1, default = 0.5 }
dry_run = { type = "boolean", default = true }
region = { type = "string", in = ["eu", "us"], default = "eu" }

[[agent.steps]]
tool = "mcp:ops:status"

[[agent.steps]]
tool = "mcp:ops:status"
[agent.steps.arguments]
service = "${params.service}"
note = "n=${params.replicas}"
who = "${env.DEPLOYER}"
nested = { list = ["${params.dry_run}", "${steps.0.result}"] }

[budget]
max_tool_calls = 10
deadline = "10m"
max_tokens = 1000

[[mcp.servers]]
name = "ops"
command = "ops-server"
allow_tools = ["status"]
"""

SPECS = {
    "s": ParamSpec(type="string"),
    "i": ParamSpec(type="integer"),
    "n": ParamSpec(type="number"),
    "b": ParamSpec(type="boolean"),
}


def _load(**kwargs: Any) -> Contract:
    return load_contract_text(TEXT, source="params.toml", **kwargs)


def test_caller_params_are_checked_and_defaults_filled() -> None:
    contract = _load(params={"service": "web"})
    assert contract.param_values == {
        "dry_run": True,
        "ratio": 0.5,
        "region": "eu",
        "replicas": 2,
        "service": "web",
    }


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({}, "service"),  # required, no default
        ({"service": "Web"}, "service"),  # regex
        ({"service": "abcdefghijk"}, "service"),  # max_len
        ({"service": "web", "replicas": 0}, "replicas"),  # min
        ({"service": "web", "replicas": "2"}, "replicas"),  # type
        ({"service": "web", "replicas": True}, "replicas"),  # a bool is not an integer
        ({"service": "web", "region": "ap"}, "region"),  # in
        ({"service": "web", "zone": "x"}, "zone"),  # undeclared
    ],
)
def test_bad_caller_params_are_refused_naming_the_param(params: dict[str, Any], param: str) -> None:
    with pytest.raises(ContractError) as caught:
        _load(params=params)
    assert caught.value.fields["param"] == param


def test_param_args_are_typed_by_spec() -> None:
    assert parse_param_args(["s=1", "i=-3", "n=2.5", "b=false"], SPECS) == {"s": "1", "i": -3, "n": 2.5, "b": False}
    assert parse_param_args(["s=a=b"], SPECS) == {"s": "a=b"}


@pytest.mark.parametrize("arg", ["i=1.5", "i=x", "n=nan", "n=inf", "b=maybe", "nobody=1", "s", "=1"])
def test_param_args_that_do_not_parse_are_usage_errors(arg: str) -> None:
    with pytest.raises(UsageError):
        parse_param_args([arg], SPECS)


def test_param_given_twice_is_refused() -> None:
    with pytest.raises(UsageError):
        parse_param_args(["s=a", "s=b"], SPECS)


def test_effective_contract_keeps_templates_and_records_param_values() -> None:
    contract = _load(param_args=["service=api", "replicas=3"])
    assert "${params.service}" in contract.contract.intent
    assert contract.param_values["replicas"] == 3
    assert contract.to_json()["param_values"]["service"] == "api"


def test_render_intent_fills_params_and_environment() -> None:
    contract = _load(params={"service": "api"})
    text = render_intent(contract, {"DEPLOYER": "ann"})
    assert text == "Deploy api x2 (dry true) as ann."


def test_render_intent_names_an_unset_environment_variable() -> None:
    contract = _load(params={"service": "api"})
    with pytest.raises(InputError) as caught:
        render_intent(contract, {})
    assert caught.value.fields["env"] == "DEPLOYER"


def test_render_arguments_keeps_types_of_whole_references_and_leaves_steps() -> None:
    contract = _load(params={"service": "api"})
    rendered = render_arguments(
        contract.agent.steps[1].arguments, params=contract.param_values, environ={"DEPLOYER": "x"}
    )
    assert rendered == {
        "service": "api",
        "note": "n=2",
        "who": "x",
        "nested": {"list": [True, "${steps.0.result}"]},
    }


def test_environ_given_at_load_must_set_every_referenced_variable() -> None:
    with pytest.raises(ContractError) as caught:
        _load(params={"service": "api"}, environ={})
    assert caught.value.fields["env"] == "DEPLOYER"
    assert _load(params={"service": "api"}, environ={"DEPLOYER": "a"}).param_values["service"] == "api"


def test_narrow_budget_lowers_limits() -> None:
    contract = _load(params={"service": "api"})
    narrowed = narrow_budget(contract, {"max_tool_calls": 3, "deadline": "1m", "max_tokens": 500})
    assert (narrowed.budget.max_tool_calls, narrowed.budget.deadline, narrowed.budget.max_tokens) == (3, "1m", 500)
    assert narrowed.hash != contract.hash
    assert narrow_budget(contract, {"max_tool_calls": 10}).hash == contract.hash


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_tool_calls": 11},
        {"deadline": "11m"},
        {"max_tokens": 1001},
        {"charge_memo_hits": False},
        {"unknown": 1},
        {"max_tool_calls": "3"},
        {"max_tool_calls": True},
        {"deadline": "soon"},
        {"max_model_turns": 0},
    ],
)
def test_narrow_budget_refuses_raising_unknown_or_bad_values(overrides: dict[str, Any]) -> None:
    contract = _load(params={"service": "api"})
    with pytest.raises(InputError):
        narrow_budget(contract, overrides)


def test_unset_max_tokens_can_be_narrowed_to_any_limit() -> None:
    contract = load_contract_text('[contract]\nname = "a"\nintent = "b"\n', source="a.toml")
    assert narrow_budget(contract, {"max_tokens": 10}).budget.max_tokens == 10


BASE = (
    '[contract]\nname = "f"\nintent = "i"\n[[mcp.servers]]\nname = "a"\ncommand = "x"\nallow_tools = ["b"]\n'
    '[[agent.steps]]\ntool = "mcp:a:b"\n[agent]\n'
)


def test_agent_final_may_refer_to_any_planned_step_and_to_params() -> None:
    contract = load_contract_text(BASE + 'final = "got ${steps.0.result/x}"\n', source="f.toml")
    assert contract.agent.final == "got ${steps.0.result/x}"


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ('final = "${steps.1.result}"', "agent.final"),  # only one step is planned
        ('system = "${env.HOME}"', "agent.system"),  # no substitution in the system prompt
        ('model = "${params.m}"', "agent.model"),
    ],
)
def test_references_outside_intent_arguments_and_final_are_refused(line: str, path: str) -> None:
    with pytest.raises(ContractError) as caught:
        load_contract_text(BASE + line + "\n", source="f.toml")
    assert caught.value.fields["path"] == path


def test_a_caller_value_too_long_for_its_regex_is_refused_without_running_it() -> None:
    spec = ParamSpec(type="string", regex="^a+b+c+d$")  # three quantifiers: tested on short values only
    assert spec.problem_with("aabbccd") is None
    problem = spec.problem_with("a" * 100_000 + "bcd")
    assert problem is not None and "longer than" in problem


@pytest.mark.parametrize("value", [2**53 + 1, -(2**53) - 1, float("nan"), float("inf")])
def test_caller_numbers_without_an_exact_json_form_are_refused(value: float) -> None:
    spec = ParamSpec(type="number")
    assert spec.problem_with(value) is not None


def test_caller_string_with_a_lone_surrogate_is_refused() -> None:
    assert ParamSpec(type="string").problem_with("a\ud800b") is not None
