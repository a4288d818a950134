"""Quotas through the CLI: an operator quota bounds every contract; a refusal is exit 6 with nothing run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from tests.durability.support import make_home, truss

CONTRACT = """
[contract]
name = "no-tools"
intent = "say done"
[agent]
final = "done"
[budget]
max_tool_calls = 3
[done]
pass_without_checks = true  # no tools, no checks: the run passes only because it says so
"""

NARROWER = (
    CONTRACT
    + """
[[quotas]]
name = "contract-calls"
window = "1h"
tool_calls = 2
"""
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = make_home(tmp_path / "home")
    (path / "config.toml").write_text(
        '[[harness.quotas]]\nname = "one-a-day"\nwindow = "24h"\nruns = 1\n', encoding="utf-8"
    )
    return path


def test_an_operator_quota_refuses_the_second_run_with_exit_6_and_records_no_session(
    home: Path, tmp_path: Path
) -> None:
    contract = tmp_path / "c.toml"
    contract.write_text(CONTRACT, encoding="utf-8")
    first = truss(home, "run", str(contract))
    assert first.returncode == 0, first.stderr
    second = truss(home, "run", str(contract), "--json")
    assert second.returncode == 6, second.stdout + second.stderr
    assert "one-a-day" in second.stderr and "frees up at" in second.stderr and "Traceback" not in second.stderr
    listed: Any = json.loads(truss(home, "sessions", "--json").stdout)
    rows = cast("list[Any]", listed["sessions"] if isinstance(listed, dict) else listed)
    assert len(rows) == 1
    verified = truss(home, "ledger", "verify", "--all")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_contract_quota_only_narrows_the_operator_s(home: Path, tmp_path: Path) -> None:
    contract = tmp_path / "c.toml"
    contract.write_text(NARROWER, encoding="utf-8")
    refused = truss(home, "run", str(contract))
    assert refused.returncode == 6 and "contract-calls" in refused.stderr  # 3 worst-case calls > 2
    (home / "config.toml").write_text("", encoding="utf-8")
    still = truss(home, "run", str(contract))
    assert still.returncode == 6  # without the operator's quota the contract's own still holds


def test_a_quota_table_with_a_bad_key_is_a_contract_error(home: Path, tmp_path: Path) -> None:
    contract = tmp_path / "c.toml"
    contract.write_text(CONTRACT + '[[quotas]]\nwindow = "1h"\nper = "tool"\nruns = 1\n', encoding="utf-8")
    bad = truss(home, "contract", "check", str(contract))
    assert bad.returncode == 2 and "tool" in bad.stderr and "Traceback" not in bad.stderr
    (home / "config.toml").write_text('[[quotas]]\nwindow = "1h"\nruns = 1\n', encoding="utf-8")
    good = tmp_path / "ok.toml"
    good.write_text(CONTRACT, encoding="utf-8")
    misplaced = truss(home, "contract", "check", str(good))
    assert misplaced.returncode == 2 and "quotas" in misplaced.stderr
