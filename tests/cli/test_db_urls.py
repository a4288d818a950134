"""``--db`` takes a path or a store URL, as a user types it: ``truss`` in a subprocess with a real stdio server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, truss_cmd
from tests.e2e.test_run_cli import tools_contract
from truss.ledger.keys import IdentityKey

pytestmark = pytest.mark.slow  # each test runs `truss` in subprocesses

BODY = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "hello" }
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:echo"
"""


def truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    return subprocess.run(
        [*truss_cmd(), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=90, check=False
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    IdentityKey.create(path / "identity.key")
    return path


def test_a_sqlite_url_and_the_bare_path_it_names_are_one_ledger(home: Path, tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "ledger.db"
    run = truss(home, "--db", f"sqlite://{db}", "run", str(tools_contract(tmp_path, BODY)), "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    session = json.loads(run.stdout)["session"]
    listed = truss(home, "ledger", "list", "--db", str(db), "--json")
    assert [s["id"] for s in json.loads(listed.stdout)["sessions"]] == [session]
    verified = truss(home, "ledger", "verify", "--db", f"sqlite://{db}")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert not (home / "ledger.db").exists(), "the home's default ledger was not touched"


def test_a_run_on_the_memory_store_reaches_its_verdict_and_leaves_no_ledger_behind(home: Path, tmp_path: Path) -> None:
    run = truss(home, "--db", "memory:", "run", str(tools_contract(tmp_path, BODY)), "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["status"] == "pass"
    assert not (home / "ledger.db").exists()
    later = truss(home, "--db", "memory:", "ledger", "list")
    assert later.returncode == 2 and "Traceback" not in later.stderr


@pytest.mark.parametrize(
    ("db", "shown"),
    [
        ("nosuch:thing", "nosuch"),
        ("postgresql://truss:hunter2@db.example.com/ledger", "postgresql"),
        ("sqlite://db.example.com/ledger.db", "host"),
        ("sqlite:///ledger.db?mode=ro", "query"),
    ],
)
def test_a_db_that_names_no_usable_store_is_a_usage_error_without_a_traceback_or_a_password(
    home: Path, db: str, shown: str
) -> None:
    for args in (("sessions",), ("ledger", "verify"), ("--json", "ledger", "list")):
        done = truss(home, "--db", db, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert shown in done.stderr and "Traceback" not in done.stderr
        assert "hunter2" not in done.stderr + done.stdout
