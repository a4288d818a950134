"""``[harness] db`` in the operator config names the ledger: ``truss`` in subprocesses, a real PostgreSQL.

Precedence ``--db`` > ``$TRUSS_DB`` > ``[harness] db`` > ``HOME/ledger.db``; the setting is not part
of the effective contract (its hash is the same with or without it); a password in it is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.durability.support import counting_contract, make_home
from tests.durability.support import truss as truss_env

pytestmark = pytest.mark.slow  # each test runs `truss` in subprocesses


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def _config(home: Path, db: str, extra: str = "") -> None:
    (home / "config.toml").write_text(f"[harness]\ndb = {json.dumps(db)}\n{extra}", encoding="utf-8")


def _sessions(home: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    listed = json.loads(_ok(truss_env(home, "--json", *args, "sessions", env=env)).stdout)
    return [s["id"] for s in listed["sessions"]]


def test_a_run_records_into_the_postgresql_ledger_the_operator_config_names(tmp_path: Path, postgres_url: str) -> None:
    home = make_home(tmp_path / "home")
    _config(home, postgres_url)
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    run = json.loads(_ok(truss_env(home, "--json", "run", str(contract), "--session", "s-config")).stdout)
    assert run["status"] == "pass"
    assert not (home / "ledger.db").exists(), "nothing went to the SQLite default"
    assert _sessions(home) == ["s-config"]
    assert _sessions(home, "--db", postgres_url) == ["s-config"]
    _ok(truss_env(home, "ledger", "verify", "--all"))


def test_db_on_the_command_line_beats_truss_db_which_beats_the_operator_config(
    tmp_path: Path, postgres_urls: Callable[[], str]
) -> None:
    configured, from_env, from_flag = postgres_urls(), postgres_urls(), postgres_urls()
    home = make_home(tmp_path / "home")
    _config(home, configured)
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    _ok(truss_env(home, "run", str(contract), "--session", "s-flag", "--db", from_flag, env={"TRUSS_DB": from_env}))
    _ok(truss_env(home, "run", str(contract), "--session", "s-env", env={"TRUSS_DB": from_env}))
    _ok(truss_env(home, "run", str(contract), "--session", "s-conf"))
    assert _sessions(home, "--db", from_flag) == ["s-flag"]
    assert _sessions(home, "--db", from_env) == ["s-env"]
    assert _sessions(home) == ["s-conf"]
    assert not (home / "ledger.db").exists()


def test_the_ledger_the_operator_config_names_does_not_change_the_contracts_hash(
    tmp_path: Path, postgres_url: str
) -> None:
    home = make_home(tmp_path / "home")
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    allow = f"allow_commands = {json.dumps([sys.executable])}\n"
    (home / "config.toml").write_text("[harness]\n" + allow, encoding="utf-8")
    without = json.loads(_ok(truss_env(home, "--json", "contract", "show", str(contract))).stdout)["hash"]
    _config(home, postgres_url, allow)
    shown = json.loads(_ok(truss_env(home, "--json", "contract", "show", str(contract))).stdout)
    assert shown["hash"] == without
    assert "db" not in shown["contract"].get("harness", {})
    _ok(truss_env(home, "run", str(contract), "--session", "s-hash"))
    recorded = _ok(truss_env(home, "--json", "ledger", "show", "s-hash")).stdout
    assert without in recorded, "the session records the hash the contract has without [harness] db"


def test_a_sqlite_path_in_the_operator_config_is_relative_to_the_home(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    _config(home, "ledgers/main.db")
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    _ok(truss_env(home, "run", str(contract), "--session", "s-path"))
    assert (home / "ledgers" / "main.db").exists() and not (home / "ledger.db").exists()
    assert _sessions(home) == ["s-path"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://truss:hunter2-secret@db.internal/truss",
        "postgresql://truss@db.internal/truss?password=hunter2-secret",
        "postgresql://truss@db.internal/truss?sslpassword=hunter2-secret",
    ],
    ids=["user-info", "password-parameter", "sslpassword-parameter"],
)
def test_a_password_written_in_the_operator_configs_db_is_refused_without_echoing_it(tmp_path: Path, url: str) -> None:
    home = make_home(tmp_path / "home")
    _config(home, url)
    proc = _ok(truss_env(home, "sessions"), code=2)
    assert "hunter2-secret" not in proc.stdout + proc.stderr
    assert "config.toml" in proc.stderr and "PGPASSWORD" in proc.stderr
    assert not (home / "ledger.db").exists()
