"""Issue 15 (part A) through the CLI as a user runs it: ``--version``, ``--limit 0``, ``truss approve
SESSION`` listing what waits, a repeated request for a suspended session, memo hits marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_run_cli import APPROVAL_BODY, home, tools_contract, truss
from tests.report.sessions import MEMO, MEMO_SERVER, SIGNAL, SIGNAL_SERVER, _counting_contract  # pyright: ignore[reportPrivateUsage]
from truss import __version__

__all__ = ["home"]

SECRET_APPROVAL_BODY = APPROVAL_BODY.replace('text = "hello"', 'text = "hello", token = "s3cr3t-canary-value"')
SECRET_SERVER = 'secret_args = ["token"]'


def test_version_prints_the_package_version_and_exits_0(home: Path) -> None:
    done = truss(home, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"truss {__version__}"


@pytest.mark.slow
def test_limit_0_lists_every_session_in_sessions_and_ledger_list(home: Path, tmp_path: Path) -> None:
    contract = tools_contract(tmp_path, APPROVAL_BODY)
    for n in range(3):
        assert truss(home, "run", str(contract), "--session", f"s{n}").returncode == 3
    for command in (["sessions"], ["ledger", "list"]):
        every = json.loads(truss(home, *command, "--limit", "0", "--json").stdout)["sessions"]
        assert {s["id"] for s in every} == {"s0", "s1", "s2"}, command
        two = json.loads(truss(home, *command, "--limit", "2", "--json").stdout)["sessions"]
        assert len(two) == 2, command
        negative = truss(home, *command, "--limit", "-1")
        assert negative.returncode == 2 and "0 for all" in negative.stderr
        assert "Traceback" not in negative.stderr


@pytest.mark.slow
def test_approve_without_a_call_lists_the_waiting_calls_with_redacted_arguments(home: Path, tmp_path: Path) -> None:
    contract = tools_contract(tmp_path, SECRET_APPROVAL_BODY, server_extra=SECRET_SERVER)
    run = truss(home, "run", str(contract), "--session", "waits")
    assert run.returncode == 3, run.stdout + run.stderr
    listed = truss(home, "approve", "waits")
    assert listed.returncode == 0, listed.stderr
    assert "c2.0" in listed.stdout and "mcp:tools:write" in listed.stdout
    assert "writes need a person" in listed.stdout and "truss approve waits CALL" in listed.stdout
    assert "s3cr3t-canary-value" not in listed.stdout + listed.stderr
    (row,) = json.loads(truss(home, "approve", "waits", "--json").stdout)["waiting"]
    assert (row["call"], row["tool"], row["reason"]) == ("c2.0", "mcp:tools:write", "writes need a person")
    assert row["arguments"]["path"] == "out.txt" and row["arguments"]["token"] != "s3cr3t-canary-value"
    # Listing changed nothing: the call is still waiting and can be approved.
    assert truss(home, "approve", "waits", "c2.0").returncode == 0
    after = truss(home, "approve", "waits")
    assert after.returncode == 0 and "no call of waits is waiting" in after.stdout
    refused = truss(home, "approve", "waits", "--deny")
    assert refused.returncode == 2 and "need the CALL" in refused.stderr


@pytest.mark.slow
def test_a_repeated_run_of_a_session_waiting_on_a_signal_keeps_its_waiting_on(home: Path, tmp_path: Path) -> None:
    contract = _counting_contract(tmp_path, "signal", SIGNAL, SIGNAL_SERVER)
    first = truss(home, "run", str(contract), "--session", "sig", "--json")
    assert first.returncode == 3, first.stdout + first.stderr
    again = truss(home, "run", str(contract), "--session", "sig", "--json")
    assert again.returncode == 3
    before, after = json.loads(first.stdout), json.loads(again.stdout)
    assert after["waiting_on"] == before["waiting_on"] == "signal"
    assert after["waiting"] == before["waiting"] == ["c1.0"]
    human = truss(home, "run", str(contract), "--session", "sig")
    assert "truss signal sig NAME" in human.stdout


@pytest.mark.slow
def test_a_memo_hit_is_marked_in_the_progress_lines_and_in_ledger_show(home: Path, tmp_path: Path) -> None:
    contract = _counting_contract(tmp_path, "memo", MEMO, MEMO_SERVER)
    first = truss(home, "run", str(contract), "--session", "memo-a")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "memo hit" not in first.stderr
    second = truss(home, "run", str(contract), "--session", "memo-b")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(memo hit: result recorded by memo-a, not sent)" in second.stderr
    shown = truss(home, "ledger", "show", "memo-b")
    assert "memo hit: answered from session memo-a" in shown.stdout
    entries = json.loads(truss(home, "ledger", "show", "memo-b", "--json").stdout)["entries"]
    (hit,) = [e for e in entries if "memo_hit" in e]
    assert hit["kind"] == "mcp_tool_call" and hit["memo_hit"]["session"] == "memo-a"
    assert not [e for e in json.loads(truss(home, "ledger", "show", "memo-a", "--json").stdout)["entries"]
                if "memo_hit" in e]  # fmt: skip
