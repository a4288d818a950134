"""docs/contracts.md documents every key the contract models accept, so the reference cannot fall behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from truss import contract as models

DOC = (Path(__file__).resolve().parent.parent.parent / "docs" / "contracts.md").read_text()
MODELS: list[type[BaseModel]] = [
    models.ContractMeta,
    models.ParamSpec,
    models.AgentConfig,
    models.Step,
    models.Budget,
    models.Policy,
    models.PolicyRule,
    models.ArgCondition,
    models.Server,
    models.SecretHeader,
    models.ToolSettings,
    models.AsyncDecl,
    models.AsyncPending,
    models.Elicitation,
    models.Sandbox,
    models.SandboxLimits,
    models.DoneCheck,
    models.Reviewer,
    models.LedgerSettings,
    models.Harness,
]
KEYS = sorted({(m.__name__, f.alias or n) for m in MODELS for n, f in m.model_fields.items()})


@pytest.mark.parametrize(("model", "key"), KEYS, ids=[f"{m}.{k}" for m, k in KEYS])
def test_every_contract_key_is_in_the_reference(model: str, key: str) -> None:
    assert f"`{key}`" in DOC, f"{model}.{key} is not documented in docs/contracts.md"


TABLES = [
    "[contract]",
    "[agent]",
    "[budget]",
    "[policy]",
    "[[mcp.servers]]",
    "[[done.checks]]",
    "[[done.checks.reviewers]]",
    "[ledger]",
    "[harness]",
]


@pytest.mark.parametrize("table", TABLES)
def test_every_table_has_a_section(table: str) -> None:
    assert f"## `{table}`" in DOC or f"### `{table}`" in DOC
