"""Policy as data: each file in ``cases/`` is a contract, an optional mount set, and calls with
the decision each must get. File names say what the cases defend against."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from truss.contract import Contract
from truss.policy import Allow, Ask, Deny, decide
from truss.tools import MountedTool

from ._support import mount_all, mounted_tool

CASES = Path(__file__).parent / "cases"


def _load(path: Path) -> tuple[Contract, dict[str, MountedTool], list[dict[str, Any]]]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = data.pop("cases")
    mounts: list[dict[str, Any]] | None = data.pop("mounted", None)
    contract = Contract.model_validate(data)
    if mounts is None:
        mounted = mount_all(contract)
    else:
        tools = [mounted_tool(m["server"], m["tool"], m.get("annotations")) for m in mounts]
        mounted = {t.name: t for t in tools}
    return contract, mounted, cases


def _params() -> list[Any]:
    params: list[Any] = []
    for path in sorted(CASES.glob("*.toml")):
        _, _, cases = _load(path)
        for index, case in enumerate(cases):
            params.append(pytest.param(path, index, id=f"{path.stem}[{index}]:{case['call']}"))
    return params


@pytest.mark.parametrize(("path", "index"), _params())
def test_policy_case_gets_its_recorded_decision(path: Path, index: int) -> None:
    contract, mounted, cases = _load(path)
    case = cases[index]
    decision = decide(contract, case["call"], case.get("arguments", {}), mounted)

    expected_rule = case.get("rule")
    if case["expect"] == "allow":
        assert decision == Allow(expected_rule)
    elif case["expect"] == "ask":
        assert isinstance(decision, Ask)
        assert decision.rule == expected_rule
    else:
        assert isinstance(decision, Deny)
        assert (decision.code, decision.rule) == (case["code"], expected_rule)
    if "reason" in case:
        assert isinstance(decision, Deny | Ask)
        assert decision.reason == case["reason"]


def test_every_case_file_loads_as_a_contract() -> None:
    files = sorted(CASES.glob("*.toml"))
    assert len(files) >= 10
    for path in files:
        _, _, cases = _load(path)
        assert cases, path.name
