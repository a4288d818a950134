"""docs/contracts.md documents every key the contract models accept, each as a row of its own table's
section, so the reference cannot fall behind.

Looking for a key anywhere in the page passed with a key's row deleted (``tool`` is written in many
places); so each model's keys are looked for as the first cell of a table row in the section of its
table, and keys of an inline table (``pending = { pointer, equals }``) in the row of the key that
holds it. ``test_cutting_any_row_makes_the_check_fail`` runs the same check on copies of the page
with one row cut, so the check itself can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from truss import contract as models
from truss.contract.models import DoneConfig

DOC = (Path(__file__).resolve().parent.parent.parent / "docs" / "contracts.md").read_text()

SECTIONS: dict[type[BaseModel], str] = {
    models.ContractMeta: "[contract]",
    models.ParamSpec: "[contract.params]",
    models.AgentConfig: "[agent]",
    models.Step: "[[agent.steps]]",
    models.Budget: "[budget]",
    models.Policy: "[policy]",
    models.PolicyRule: "[[policy.rules]]",
    models.ArgCondition: "[[policy.rules]]",
    models.Server: "[[mcp.servers]]",
    models.ToolSettings: "[[mcp.servers.tools]]",
    models.AsyncDecl: "[[mcp.servers.async]]",
    models.Elicitation: "[mcp.servers.elicitation]",
    models.Sandbox: "[mcp.servers.sandbox]",
    models.DoneCheck: "[[done.checks]]",
    DoneConfig: "[[done.checks]]",
    models.Reviewer: "[[done.checks.reviewers]]",
    models.LedgerSettings: "[ledger]",
    models.Harness: "[harness]",
    models.Quota: "[[quotas]]",
}
# Inline tables: their keys are written in the row of the key that holds them.
INLINE: dict[type[BaseModel], tuple[str, str]] = {
    models.SecretHeader: ("[[mcp.servers]]", "headers"),
    models.AsyncPending: ("[[mcp.servers.async]]", "pending"),
    models.SandboxLimits: ("[mcp.servers.sandbox]", "limits"),
}
# Keys that are tables with sections of their own (checked by test_every_table_has_a_section).
TABLE_KEYS = {("DoneConfig", "checks")}


def _keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items() if (model.__name__, f.alias or n) not in TABLE_KEYS]


def sections(text: str) -> dict[str, list[str]]:
    """The lines under each ``##``/``###`` heading, by the heading's backquoted name (code blocks skipped)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{2,3} ", line):
            named = re.fullmatch(r"#{2,3} `(.+)`\s*", line)
            current = found.setdefault(named.group(1) if named else line, [])
            continue
        if current is not None:
            current.append(line)
    return found


def row_of(lines: list[str], key: str) -> str | None:
    """The row of a key reference table (its header has a ``meaning`` column) whose first cell names
    ``key`` (alone, with a table prefix, or among others). Other tables (a section's layering rules)
    do not count."""
    first_cell = re.compile(r"\|\s*([^|]*)\|")
    in_reference = False
    for line in lines:
        if not line.startswith("|"):
            in_reference = False
            continue
        if re.match(r"\|\s*key\s*\|", line):
            in_reference = "meaning" in line
            continue
        cell = first_cell.match(line)
        if in_reference and cell and re.search(r"`(?:[\w.\[\]]+\.)?" + re.escape(key) + "`", cell.group(1)):
            return line
    return None


def missing_rows(text: str) -> list[str]:
    """``Model.key`` for every key without its row in ``text`` (empty when the reference is complete)."""
    found = sections(text)
    missing: list[str] = []
    for model, section in SECTIONS.items():
        lines = found.get(section, [])
        missing += [f"{model.__name__}.{key}" for key in _keys(model) if row_of(lines, key) is None]
    for model, (section, holder) in INLINE.items():
        row = row_of(found.get(section, []), holder) or ""
        missing += [f"{model.__name__}.{key}" for key in _keys(model) if not re.search(rf"\b{re.escape(key)}\b", row)]
    return missing


def test_every_contract_key_has_a_row_in_its_tables_section() -> None:
    assert missing_rows(DOC) == []


CUTS = sorted({(SECTIONS[m], k) for m in SECTIONS for k in _keys(m)} | {(s, holder) for s, holder in INLINE.values()})


@pytest.mark.parametrize(("section", "key"), CUTS, ids=[f"{s}.{k}" for s, k in CUTS])
def test_cutting_any_row_makes_the_check_fail(section: str, key: str) -> None:
    lines = sections(DOC)[section]
    row = row_of(lines, key)
    assert row is not None
    cut = DOC.replace(row + "\n", "", 1)
    assert cut != DOC
    assert missing_rows(cut), f"the check still passes with the row of {key!r} cut from {section}"


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
