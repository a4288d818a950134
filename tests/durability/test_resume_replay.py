"""Resume that diverges, and offline replay, through ``truss`` as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.durability.support import (
    COUNTING,
    TIMEOUT,
    cli,
    counting_contract,
    entries,
    invocations,
    kinds,
    make_home,
    truss,
)


@pytest.mark.slow
def test_a_plan_changed_between_run_and_resume_diverges_records_where_and_calls_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = counting_contract(
        tmp_path,
        steps=[("mcp:cnt:count", {"key": "${env.TARGET}"}), ("mcp:cnt:count", {"key": "second"})],
        check_tool="mcp:cnt:count",
    )
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TARGET": "a", "TRUSS_FAULT": "after_result"})
    assert crashed.returncode == -9
    assert invocations(tmp_path) == {"count a": 1}

    resumed = truss(home, "resume", "s1", env={"TARGET": "b"})
    assert resumed.returncode == 4, resumed.stdout + resumed.stderr
    assert "DIVERGED" in resumed.stdout and "model turn 1" in resumed.stdout
    assert invocations(tmp_path) == {"count a": 1}  # nothing was called
    last = entries(home, "s1")[-1]
    assert last.kind == "session_suspended" and last.body["reason"] == "diverged"
    assert last.body["seq"] == 1 and "model_turn 1" in last.body["expected"]
    listed = cli(home, "sessions", "--json")
    assert '"status": "diverged"' in listed.stdout
    assert cli(home, "ledger", "verify").returncode == 0


@pytest.mark.slow
def test_replay_rederives_a_finished_session_with_every_server_command_unrunnable(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    server = tmp_path / "server.py"
    shutil.copy(COUNTING, server)
    contract = counting_contract(
        tmp_path,
        steps=[("mcp:cnt:count", {"key": "a"}), ("mcp:cnt:other", {"key": "b"}), ("mcp:cnt:count", {"key": "no"})],
        check_tool="mcp:cnt:other",
        # The third call is denied (by policy: a step naming a tool that is not allowlisted no longer loads).
        contract='[[policy.rules]]\ntool = "mcp:cnt:count"\neffect = "deny"\nargs = { key = { equals = "no" } }\n',
    )
    contract.write_text(contract.read_text(encoding="utf-8").replace(str(COUNTING), str(server)), encoding="utf-8")
    run = truss(home, "run", str(contract), "--session", "s1")
    assert run.returncode == 0, run.stdout + run.stderr

    server.unlink()  # the recorded command can no longer start anything
    replay = truss(home, "replay", "s1", "--json", env={"PATH": ""})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert '"matches": true' in replay.stdout
    assert invocations(tmp_path) == {"count a": 1, "other b": 1}  # replay called nothing
    resume = truss(home, "resume", "s1")  # a finished session only shows its outcome
    assert resume.returncode == 0


def test_replay_of_an_unknown_or_unfinished_session_is_bad_input(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    missing = cli(home, "replay", "nope")
    assert missing.returncode == 2 and "no session" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.slow
def test_resolve_refuses_a_call_that_is_not_in_doubt_and_records_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    assert truss(home, "run", str(contract), "--session", "s1").returncode == 0
    before = kinds(home, "s1")
    refused = cli(home, "resolve", "s1", "c1.0", "--not-sent")
    assert refused.returncode == 2 and "no unresolved in-doubt call" in refused.stderr
    bad_json = cli(home, "resolve", "s1", "c1.0", "--result", "{not json")
    assert bad_json.returncode == 2 and "not JSON" in bad_json.stderr
    assert kinds(home, "s1") == before


def test_resuming_an_ended_session_prints_its_outcome_without_the_sdk_reading_it_at_most_twice(tmp_path: Path) -> None:
    home = _ended(tmp_path, 12, "s-ended")
    resumed = _resume_counting_reads(home, "s-ended")
    assert resumed.code == 0 and "verdict     pass" in resumed.out, resumed.out
    assert resumed.heavy == []
    # Every read goes through the verified reader, which checks the chain from its first entry
    # (issue 13): the session is read twice (its facts, then its last entries), never more. Reading
    # only the tail needs a tail verified by inclusion proofs alone (docs/benchmarks.md, flat costs).
    assert 0 < len(resumed.reads) <= 2, resumed.reads


class _Resumed(NamedTuple):
    code: int
    out: str
    reads: list[int]  # the first seq of each read of the session (0: the whole session)
    heavy: list[str]  # the MCP SDK packages the process imported


def _resume_counting_reads(home: Path, session: str) -> _Resumed:
    """``truss resume SESSION`` in a process of its own, the SQLite store's reads counted: its exit
    code, its stdout, the first seq of each read of ``session`` (every verified read of it starts
    with 0, the whole session) and which of the MCP SDK's packages it imported."""
    code = (
        "import io, contextlib, json, sys\n"
        "from truss.ledger.stores.sqlite import SqliteStore\n"
        "reads = []\n"
        "original = SqliteStore.read_session\n"
        "def read_session(self, session, *, from_seq=0):\n"
        "    reads.append((session, from_seq))\n"
        "    return original(self, session, from_seq=from_seq)\n"
        "SqliteStore.read_session = read_session\n"
        "from truss_cli.main import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    code = main(['--home', {str(home)!r}, 'resume', {session!r}])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types'})\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'reads': reads, 'heavy': heavy}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    reads = [start for name, start in result["reads"] if name == session]
    return _Resumed(result["code"], result["out"], reads, result["heavy"])


def _set_row(home: Path, session: str, **columns: object) -> None:
    """Write ``columns`` into the store's unsigned row of ``session`` (the entries stay as signed)."""
    import sqlite3
    from contextlib import closing

    names = ", ".join(f"{name} = ?" for name in columns)
    with closing(sqlite3.connect(home / "ledger.db")) as conn, conn:
        conn.execute(f"UPDATE sessions SET {names} WHERE id = ?", (*columns.values(), session))


def _ended(tmp_path: Path, calls: int, session: str) -> Path:
    """A home whose ``session`` of ``calls`` counted calls ran to its end (its verdict passed)."""
    contract = counting_contract(
        tmp_path, steps=[("mcp:cnt:count", {"key": f"k{i}"}) for i in range(calls)], check_tool="mcp:cnt:count"
    )
    home = make_home(tmp_path / "home")
    ran = truss(home, "run", str(contract), "--session", session)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return home


def _interrupted(tmp_path: Path, calls: int, done: int) -> Path:
    """A home whose session s1 of ``calls`` counted calls was killed after the result of call ``done``."""
    contract = counting_contract(
        tmp_path, steps=[("mcp:cnt:count", {"key": f"k{i}"}) for i in range(calls)], check_tool="mcp:cnt:count"
    )
    home = make_home(tmp_path / "home")
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": f"after_result:{done}"})
    assert crashed.returncode == -9
    return home


@pytest.mark.slow
def test_resuming_an_interrupted_session_reads_and_verifies_it_once(tmp_path: Path) -> None:
    # Regression: `truss resume` verified the whole session to learn whether it had ended, then
    # resume_session read and verified it whole again: a long session's read paid twice.
    home = _interrupted(tmp_path, 6, 3)
    resumed = _resume_counting_reads(home, "s1")
    assert resumed.code == 0 and "verdict     pass" in resumed.out, resumed.out
    assert invocations(tmp_path) == {f"count k{i}": 1 for i in range(6)}
    assert resumed.reads.count(0) == 1, resumed.reads


@pytest.mark.slow
def test_a_session_row_forged_to_a_verdict_does_not_end_the_resume_of_a_session_that_goes_on(tmp_path: Path) -> None:
    home = _interrupted(tmp_path, 4, 2)
    _set_row(home, "s1", status="pass")
    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "verdict     pass" in resumed.stdout
    assert kinds(home, "s1")[-2:] == ["verdict", "session_ended"]
    assert invocations(tmp_path) == {f"count k{i}": 1 for i in range(4)}


@pytest.mark.slow
def test_a_session_row_forged_to_say_ended_neither_ends_the_session_nor_resumes_it(tmp_path: Path) -> None:
    # The verified chain says the session goes on, so no outcome is shown from it; the store
    # refuses to append to a session its row says ended, so the resume stops there (exit 4) with
    # nothing recorded and no call sent.
    home = _interrupted(tmp_path, 4, 2)
    before = kinds(home, "s1")
    _set_row(home, "s1", ended=1, status="pass")
    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 4, resumed.stdout + resumed.stderr
    assert "verdict" not in resumed.stdout and "Traceback" not in resumed.stderr
    assert kinds(home, "s1") == before
    assert invocations(tmp_path) == {"count k0": 1, "count k1": 1}


@pytest.mark.slow
def test_a_session_row_forged_to_say_running_does_not_resume_a_session_that_ended(tmp_path: Path) -> None:
    home = _ended(tmp_path, 4, "s1")
    before = kinds(home, "s1")
    stored = _resume_counting_reads(home, "s1")  # the row as the store wrote it
    assert stored.code == 0 and "verdict     pass" in stored.out, stored.out
    _set_row(home, "s1", ended=0, status="running")
    forged = _resume_counting_reads(home, "s1")
    assert (forged.code, forged.out) == (stored.code, stored.out)  # the same outcome, printed the same
    assert forged.reads.count(0) == stored.reads.count(0), (forged.reads, stored.reads)  # verified as often
    assert kinds(home, "s1") == before  # nothing appended
    assert invocations(tmp_path) == {f"count k{i}": 1 for i in range(4)}  # no call sent again
