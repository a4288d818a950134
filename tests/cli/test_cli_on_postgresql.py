"""The whole CLI on a PostgreSQL ledger, run as a user runs it: ``truss`` in subprocesses, a real server.

Every command a session goes through (run, resume, approve, resolve, signal, replay, sessions, each
``ledger`` command) runs with ``TRUSS_DB`` or ``--db`` naming a ``postgresql://`` ledger; a real
SQLite ledger is migrated into PostgreSQL and verified there. The counting server records every
call durably, so the tests count what reached it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.durability.support import counting_contract, invocations, make_home
from tests.durability.support import truss as truss_env
from tests.ledger.stores.test_without_psycopg import HIDE_PSYCOPG
from truss.ledger.keys import IdentityKey

pytestmark = pytest.mark.slow  # each test runs `truss` in subprocesses

ASK = '[[policy.rules]]\ntool = "mcp:cnt:count"\neffect = "ask"\nreason = "a person looks first"\n'
ASYNC = """
[[mcp.servers.async]]
tool = "deploy"
pending = { pointer = "/status", equals = "pending" }
signal = "/job"
"""


def _on(url: str) -> dict[str, str]:
    return {"TRUSS_DB": url}


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def _with_policy(contract: Path, text: str) -> Path:
    with contract.open("a", encoding="utf-8") as f:
        f.write(text)
    return contract


def test_a_run_and_every_ledger_command_work_on_a_postgresql_ledger(tmp_path: Path, postgres_url: str) -> None:
    home, env = make_home(tmp_path / "home"), _on(postgres_url)
    contract = counting_contract(
        tmp_path, steps=[("mcp:cnt:count", {"key": "a"}), ("mcp:cnt:other", {"key": "b"})], check_tool="mcp:cnt:count"
    )
    run = json.loads(_ok(truss_env(home, "--json", "run", str(contract), "--session", "s-pass", env=env)).stdout)
    assert run["status"] == "pass" and invocations(tmp_path) == {"count a": 1, "other b": 1}
    assert not (home / "ledger.db").exists(), "nothing went to the SQLite default"

    sessions = json.loads(_ok(truss_env(home, "--json", "sessions", env=env)).stdout)
    assert [s["id"] for s in sessions["sessions"]] == ["s-pass"]
    listed = _ok(truss_env(home, "ledger", "list", env=env)).stdout
    assert "s-pass" in listed and "durable" in listed
    assert "mcp_tool_call" in _ok(truss_env(home, "ledger", "show", "s-pass", env=env)).stdout
    _ok(truss_env(home, "ledger", "verify", "s-pass", env=env))
    whole = json.loads(_ok(truss_env(home, "--json", "ledger", "verify", "--all", env=env)).stdout)
    assert whole["ok"] and whole["entries"] == len(list(_kinds(home, postgres_url, "s-pass")))
    verdict = json.loads(_ok(truss_env(home, "--json", "ledger", "verdict", "s-pass", env=env)).stdout)
    assert verdict["verified"] and verdict["statement"]["predicate"]["status"] == "pass"
    bundle = tmp_path / "s-pass.bundle.json"
    _ok(truss_env(home, "ledger", "export", "s-pass", "--output", str(bundle), env=env))
    vkey = IdentityKey.load(home / "identity.key").verifier.vkey
    _ok(truss_env(home, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", vkey))  # offline, no --db
    _ok(truss_env(home, "ledger", "checkpoint", env=env))
    _ok(truss_env(home, "replay", "s-pass", env=env))
    _ok(truss_env(home, "ledger", "erase", "s-pass", "--payloads", env=env))
    _ok(truss_env(home, "ledger", "verify", "--all", env=env))
    again = _ok(truss_env(home, "--db", postgres_url, "run", str(contract), "--session", "s-pass"))
    assert "already exists" in again.stdout and invocations(tmp_path) == {"count a": 1, "other b": 1}


def test_approve_resolve_and_signal_resume_sessions_on_a_postgresql_ledger(tmp_path: Path, postgres_url: str) -> None:
    home, env = make_home(tmp_path / "home"), _on(postgres_url)
    ask = tmp_path / "ask"
    ask.mkdir()
    asking = _with_policy(
        counting_contract(ask, steps=[("mcp:cnt:count", {"key": "x"})], check_tool="mcp:cnt:count", name="ask"), ASK
    )
    _ok(truss_env(home, "run", str(asking), "--session", "s-ask", env=env), 3)
    _ok(truss_env(home, "approve", "s-ask", "c1.0", "--reason", "looked", env=env))
    _ok(truss_env(home, "resume", "s-ask", env=env))
    assert invocations(ask) == {"count x": 1}

    doubt = tmp_path / "doubt"
    doubt.mkdir()
    plain = counting_contract(doubt, steps=[("mcp:cnt:count", {"key": "y"})], check_tool="mcp:cnt:count")
    crashed = truss_env(home, "run", str(plain), "--session", "s-doubt", env={**env, "TRUSS_FAULT": "after_intent"})
    assert crashed.returncode != 0
    _ok(truss_env(home, "resume", "s-doubt", env=env), 3)  # in doubt: count is not safe to re-send
    _ok(truss_env(home, "resolve", "s-doubt", "c1.0", "--not-sent", env=env))
    _ok(truss_env(home, "resume", "s-doubt", env=env))
    assert invocations(doubt) == {"count y": 1}, "the in-doubt call reached the server once, after resolve"

    later = tmp_path / "later"
    later.mkdir()
    deploy = counting_contract(
        later, steps=[("mcp:cnt:deploy", {"name": "web"})], check_tool="mcp:cnt:deploy", server=ASYNC, name="dep"
    )
    _ok(truss_env(home, "run", str(deploy), "--session", "s-sig", env=env), 3)
    _ok(truss_env(home, "signal", "s-sig", "job-web", "--payload", '{"status": "done"}', env=env))
    _ok(truss_env(home, "resume", "s-sig", env=env))

    listed = {
        s["id"]: s["status"] for s in json.loads(truss_env(home, "--json", "sessions", env=env).stdout)["sessions"]
    }
    assert listed == {"s-ask": "pass", "s-doubt": "pass", "s-sig": "pass"}
    _ok(truss_env(home, "ledger", "verify", "--all", env=env))
    for session in listed:
        _ok(truss_env(home, "replay", session, env=env))


def test_ledger_migrate_of_a_real_sqlite_ledger_then_verify_all_on_postgresql(
    tmp_path: Path, postgres_url: str
) -> None:
    home = make_home(tmp_path / "home")  # runs record into the SQLite default, HOME/ledger.db
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "m"})], check_tool="mcp:cnt:count")
    _ok(truss_env(home, "run", str(contract), "--session", "s-one"))
    _ok(truss_env(home, "run", str(_with_policy(contract, ASK)), "--session", "s-two"), 3)
    _ok(truss_env(home, "ledger", "erase", "s-one", "--payloads"))
    before = json.loads(_ok(truss_env(home, "--json", "sessions")).stdout)["sessions"]

    moved = json.loads(
        _ok(
            truss_env(home, "--json", "ledger", "migrate", "--from", str(home / "ledger.db"), "--to", postgres_url)
        ).stdout
    )
    assert moved["sessions"] == 2 and moved["checkpoints"] >= 2
    assert "host" not in moved["to"], "the URL is shown without its query"
    whole = json.loads(_ok(truss_env(home, "--json", "--db", postgres_url, "ledger", "verify", "--all")).stdout)
    assert whole["ok"] and whole["entries"] == moved["entries"]
    after = json.loads(_ok(truss_env(home, "--json", "--db", postgres_url, "sessions")).stdout)["sessions"]
    assert after == before
    _ok(truss_env(home, "--db", postgres_url, "approve", "s-two", "c1.0"))
    _ok(truss_env(home, "--db", postgres_url, "resume", "s-two"))  # the copy carries on where the file stopped
    _ok(truss_env(home, "--db", postgres_url, "ledger", "verify", "--all"))
    into_full = truss_env(home, "ledger", "migrate", "--to", postgres_url)
    assert into_full.returncode == 4 and "already holds" in into_full.stderr


def test_a_sqlite_ledger_that_does_not_verify_is_not_migrated(tmp_path: Path, postgres_url: str) -> None:
    home = make_home(tmp_path / "home")
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "t"})], check_tool="mcp:cnt:count")
    _ok(truss_env(home, "run", str(contract), "--session", "s-t"))
    conn = sqlite3.connect(str(home / "ledger.db"), isolation_level=None)
    changed = conn.execute(
        "UPDATE entries SET raw = replace(raw, 'mcp:cnt:count', 'mcp:cnt:COUNT') WHERE kind = 'mcp_tool_intent'"
    ).rowcount
    assert changed == 1
    conn.close()
    refused = truss_env(home, "ledger", "migrate", "--to", postgres_url)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    empty = truss_env(home, "--json", "--db", postgres_url, "sessions")
    assert empty.returncode == 0 and json.loads(empty.stdout)["sessions"] == [], "nothing was copied"


@pytest.mark.parametrize(
    ("attack", "db"),
    [
        ("password_in_user_info", "postgresql://truss:s3cr3t-pw@db.internal/truss"),
        ("password_query_parameter", "postgresql://truss@db.internal/truss?password=s3cr3t-pw"),
    ],
)
def test_a_password_in_the_ledger_url_is_refused_with_exit_2_and_not_echoed(
    tmp_path: Path, attack: str, db: str
) -> None:
    home = make_home(tmp_path / "home")
    for args, env in ((["--db", db], {}), ([], {"TRUSS_DB": db})):
        proc = truss_env(home, *args, "--json", "ledger", "list", env=env)
        assert proc.returncode == 2, (attack, proc.stderr)
        assert "s3cr3t-pw" not in proc.stdout + proc.stderr, attack
        assert json.loads(proc.stdout)["kind"] == "usage", attack


def test_without_psycopg_a_postgresql_ledger_is_a_clear_exit_2(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    code = HIDE_PSYCOPG + textwrap.dedent(
        f"""
        from truss_cli.main import main
        raise SystemExit(main(["--home", {str(home)!r}, "--db", "postgresql://truss@/truss", "ledger", "list"]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ)
    )
    assert proc.returncode == 2, proc.stderr
    assert "truss[postgres]" in proc.stderr and "Traceback" not in proc.stderr


def _kinds(home: Path, url: str, session: str) -> list[str]:
    from truss._clock import SystemClock
    from truss.ledger.stores import open_store

    store = open_store(url, key=None, clock=SystemClock(), create=False)
    try:
        return [e.kind for e in store.read_session(session)]
    finally:
        store.close()
