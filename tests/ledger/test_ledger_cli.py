"""The ledger and key commands, run as a user runs them: ``truss`` in a subprocess."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import truss_cmd
from truss._clock import SystemClock
from truss.ledger.canonical import sha256_ref
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store

pytestmark = pytest.mark.slow  # each test runs `truss` in subprocesses

ARGS = b'{"repo_path":"/srv/work/demo"}'
RESULT = b'{"content":[{"text":"On branch main","type":"text"}],"isError":false}'


def truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    return subprocess.run([*truss_cmd(), *args], env=env, check=False, capture_output=True, text=True, timeout=60)


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


@pytest.fixture
def home(truss_home: Path) -> Path:
    """A home after `truss init` with two sessions recorded, one of them with payloads."""
    init = truss(truss_home, "init", "--name", "cli.truss.test")
    assert init.returncode == 0, init.stderr
    key = IdentityKey.load(truss_home / "identity.key")
    with closing(open_store(truss_home / "ledger.db", key=key, clock=SystemClock())) as store:
        a, r = sha256_ref(ARGS), sha256_ref(RESULT)
        store.append(
            "s_one",
            [
                Record("session_started", {"contract": "repo-triage"}),
                Record("mcp_tool_intent", {"call": "c1", "tool": "mcp:git:git_status", "args": a}, {a: ARGS}),
                Record("mcp_tool_call", {"call": "c1", "args": a, "result": r, "is_error": False}, {r: RESULT}),
                Record("session_ended", {"status": "pass"}),
            ],
        )
        store.append("s_two", [Record("session_started", {"contract": "other"})])
    return truss_home


def test_init_creates_a_private_key_and_prints_the_verifier_key_that_key_show_prints(truss_home: Path) -> None:
    first = truss(truss_home, "init", "--json")
    assert first.returncode == 0, first.stderr
    created = _json(first)
    assert created["key_created"] is True
    assert (truss_home / "identity.key").stat().st_mode & 0o777 == 0o600
    shown = truss(truss_home, "key", "show")
    assert shown.returncode == 0 and shown.stdout.strip() == created["vkey"]
    again = _json(truss(truss_home, "init", "--json"))
    assert again["key_created"] is False and again["vkey"] == created["vkey"], "init is idempotent"


def test_a_key_readable_by_others_is_refused_with_exit_2_and_no_traceback(home: Path) -> None:
    (home / "identity.key").chmod(0o644)
    proc = truss(home, "key", "show")
    assert proc.returncode == 2
    assert "chmod 600" in proc.stderr and "Traceback" not in proc.stderr
    assert "PRIVATE" not in proc.stderr + proc.stdout


def test_list_shows_sessions_with_contract_status_entries_and_head(home: Path) -> None:
    # The status is derived from the chain: s_one's session_ended says pass; s_two's chain stops
    # without an end and no process holds its lease (the fixture's writer is gone), so nobody
    # drives it: it is listed interrupted, and can be resumed.
    proc = truss(home, "ledger", "list")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert lines["s_one"][1:3] == ["repo-triage", "pass"] and lines["s_two"][1:3] == ["other", "interrupted"]
    # A listing checks each row at its two ends only, and says so, row by row and once below.
    assert lines["s_one"][-1] == "ends" and lines["s_two"][-1] == "ends"
    assert "the entries between were not: `truss ledger verify SESSION`" in proc.stdout
    listed = truss(home, "sessions")
    assert listed.returncode == 0, listed.stderr
    assert all(line.split()[-1] == "ends" for line in listed.stdout.splitlines()[1:3])
    assert "the entries between were not" in listed.stdout
    rows = {s["id"]: s for s in _json(truss(home, "ledger", "list", "--json"))["sessions"]}
    assert rows["s_one"]["entries"] == 4 and rows["s_one"]["status"] == "pass"
    assert rows["s_two"]["status"] == "interrupted" and rows["s_one"]["verified"] == "ends"
    assert len(rows["s_one"]["head"]) == 64


def test_show_prints_entries_with_their_payloads_or_marks_them_erased(home: Path) -> None:
    proc = truss(home, "ledger", "show", "s_one")
    assert proc.returncode == 0, proc.stderr
    assert "mcp_tool_call" in proc.stdout and "On branch main" in proc.stdout
    data = _json(truss(home, "ledger", "show", "s_one", "--json"))
    call = data["entries"][2]
    assert call["payloads"][sha256_ref(RESULT)] == {
        "state": "present",
        "bytes": len(RESULT),
        "value": json.loads(RESULT),
    }


def test_verify_passes_a_clean_ledger_and_one_session(home: Path) -> None:
    whole = truss(home, "ledger", "verify", "--json")
    assert whole.returncode == 0, whole.stderr
    assert _json(whole)["ok"] is True and _json(whole)["entries"] == 5


def test_erase_removes_payloads_and_the_chain_still_verifies(home: Path) -> None:
    proc = truss(home, "ledger", "erase", "s_one", "--payloads", "--json")
    assert proc.returncode == 0 and _json(proc) == {"session": "s_one", "erased": 2}
    shown = _json(truss(home, "ledger", "show", "s_one", "--json"))
    assert shown["entries"][2]["payloads"][sha256_ref(RESULT)] == {"state": "erased"}
    one = truss(home, "ledger", "verify", "s_one")
    assert one.returncode == 0 and "verified session s_one" in one.stdout
    raw = (home / "ledger.db").read_bytes()
    assert b"On branch main" not in raw.replace(b"\x00", b"") or _wal_only(home), "payload bytes are gone"


def _wal_only(home: Path) -> bool:
    # Erased bytes may linger in free pages until SQLite reuses them; the WAL is checkpointed on close.
    return (home / "ledger.db-wal").exists()


def test_a_tampered_ledger_fails_verification_with_exit_1_and_its_reason(home: Path) -> None:
    conn = sqlite3.connect(str(home / "ledger.db"), isolation_level=None)
    conn.execute("UPDATE entries SET sig = zeroblob(64) WHERE idx = 2")
    conn.close()
    proc = truss(home, "ledger", "verify", "--json")
    assert proc.returncode == 1
    report = _json(proc)
    assert report["ok"] is False and report["reason"] == "bad_signature"
    assert report["session"] == "s_one" and report["seq"] == 2 and report["index"] == 2


def test_a_ledger_signed_by_a_key_not_trusted_fails_verification(home: Path, tmp_path: Path) -> None:
    stranger = IdentityKey.generate("cli.truss.test").verifier.vkey
    proc = truss(home, "ledger", "verify", "--trusted-key", stranger, "--json")
    assert proc.returncode == 1 and _json(proc)["reason"] == "untrusted_key"
    own = truss(home, "key", "show").stdout.strip()
    keyfile = tmp_path / "trusted.txt"
    keyfile.write_text(f"# rotated keys of this log\n{stranger}\n{own}\n")
    assert truss(home, "ledger", "verify", "--trusted-key", str(keyfile)).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["ledger", "verify", "s_missing"],
        ["ledger", "show", "s_missing"],
        ["ledger", "verify", "--trusted-key", "not-a-key"],
        ["ledger", "verify", "s_one", "--all"],
        ["--db", "absent.db", "ledger", "list"],
        ["ledger", "erase", "s_one"],
    ],
)
def test_unusable_input_exits_2_with_one_paragraph_and_no_traceback(home: Path, args: list[str]) -> None:
    proc = truss(home, *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("truss") and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_file_that_is_not_a_ledger_is_unusable_input_and_left_untouched(truss_home: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some text\n" * 200)
    other = tmp_path / "other-app.db"
    conn = sqlite3.connect(str(other))
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    for path in (text, other):
        proc = truss(
            truss_home, "--db", str(path), "ledger", "verify", "--trusted-key", IdentityKey.generate().verifier.vkey
        )
        assert proc.returncode == 2, proc.stderr
        assert "not a Truss ledger" in proc.stderr and "Traceback" not in proc.stderr
    assert other.read_bytes() == before
