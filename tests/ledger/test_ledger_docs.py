"""The verification steps and reason codes in docs/ledger-format.md are the ones the code uses."""

from __future__ import annotations

import re
from pathlib import Path

from truss.ledger.verification import REASONS

REPO = Path(__file__).resolve().parents[2]


def test_every_reason_code_is_documented() -> None:
    doc = (REPO / "docs" / "ledger-format.md").read_text(encoding="utf-8")
    missing = sorted(r for r in REASONS if f"`{r}`" not in doc)
    assert not missing, f"reason codes not in docs/ledger-format.md: {missing}"


def test_the_code_cites_each_documented_step_and_no_other() -> None:
    doc = (REPO / "docs" / "ledger-format.md").read_text(encoding="utf-8")
    code = (REPO / "truss" / "ledger" / "verification.py").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| (V\d+) ", doc, flags=re.MULTILINE))
    cited = set(re.findall(r"\b(V\d+)\b", code))
    assert documented == {f"V{n}" for n in range(1, 16)}
    assert cited == documented
