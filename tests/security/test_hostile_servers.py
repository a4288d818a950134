"""Attacks from an MCP server that took a run's verdict away: a hang (a catastrophic regex in its
``outputSchema``, a result too deep for the parser, a 50 MB line), a crash after the fact (a
result the next model turn could not record), a leaked secret (its own token in its server info,
a ``secret_args`` value in its stderr), a mislabelled failure (its JSON-RPC errors -32000 and
-32001 recorded as the SDK's own). Each server answer is a data file in ``data/servers/`` played
by ``servers/answers.py``; each run is ``truss run`` as a user runs it, and each must end in a
recorded failure, a verdict and a ledger that verifies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import REPO, truss_cmd
from tests.durability.support import cli, entries
from tests.durability.test_tasks import TASKS_SERVER
from tests.gate.support import files_containing, new_store
from tests.security._support import DATA, HERE, PASS_WHATEVER, truss
from truss.contract import load_contract_text
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_ledger
from truss.mcp import _schema, connect
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import ManualClock

ANSWERS = HERE / "servers" / "answers.py"
SERVERS = DATA / "servers"
SECRET = "tok-5b1f0c9e-its-own-secret"
# A run that would hang is stopped here; every case below ends in a few seconds when it works.
BOUND_S = 60


def answers_contract(
    tmp_path: Path,
    attack: str,
    tool: str,
    *,
    budget: str = 'call_timeout = "30s"',
    server_extra: str = "",
    arguments: str = '{ text = "hi" }',
    mark: Path | None = None,
) -> Path:
    """A contract whose one step calls ``tool`` of the server playing ``data/servers/<attack>.json``."""
    args = [str(ANSWERS), str(SERVERS / f"{attack}.json"), *([str(mark)] if mark is not None else [])]
    text = f"""
[contract]
name = "hostile-answers"
intent = "security test"
[budget]
{budget}
[[agent.steps]]
tool = "mcp:hostile:{tool}"
arguments = {arguments}
[[mcp.servers]]
name = "hostile"
command = {json.dumps(sys.executable)}
args = {json.dumps(args)}
allow_tools = ["{tool}"]
connect_timeout = "20s"
{server_extra}
{PASS_WHATEVER}"""
    path = tmp_path / f"{attack}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def run(home: Path, contract: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": "/usr/bin:/bin", "TRUSS_HOME": str(home), "PYTHONUTF8": "1", **(env or {})}
    return subprocess.run(
        [*truss_cmd(), *flags, "--json", "run", str(contract)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=environ,
        cwd=REPO,
        timeout=BOUND_S,
        check=False,
    )


def the_call(home: Path, session: str) -> Any:
    [call] = [e for e in entries(home, session) if e.kind == "mcp_tool_call"]
    return call


def verified(home: Path, session: str) -> bool:
    return cli(home, "ledger", "verify", session).returncode == 0


# -- hangs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attack",
    [
        "catastrophic_regex_in_output_schema_pattern",
        "catastrophic_regex_in_output_schema_pattern_properties",
        "catastrophic_regex_in_output_schema_property_names",
    ],
)
def test_a_catastrophic_regex_in_an_output_schema_fails_the_call_as_invalid_result(
    tmp_path: Path, home: Path, attack: str
) -> None:
    done = run(home, answers_contract(tmp_path, attack, "echo"))
    assert done.returncode == 0, done.stderr  # a verdict (pass_without_checks: the failed call is recorded)
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"]["cause"] == "invalid_result"
    assert verified(home, session)


def _start(home: Path, contract: Path) -> subprocess.Popen[str]:
    environ = {"PATH": "/usr/bin:/bin", "TRUSS_HOME": str(home), "PYTHONUTF8": "1"}
    return subprocess.Popen(
        [*truss_cmd(), "--json", "run", str(contract)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=REPO,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    # The server writes the mark just before it answers; polling a file is the only signal there is.
    import time

    end = time.monotonic() + BOUND_S
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the server was never called"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_an_exponential_output_schema_check_interrupts_the_run(
    tmp_path: Path, home: Path, sig: signal.Signals
) -> None:
    mark = tmp_path / "called"
    contract = answers_contract(
        tmp_path, "output_schema_that_branches_exponentially", "echo", budget='call_timeout = "5m"', mark=mark
    )
    proc = _start(home, contract)
    try:
        _wait_for(mark, proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 3, err  # suspended: interrupted, resumable
    session = json.loads(out)["session"]
    suspended = [e for e in entries(home, session) if e.kind == "session_suspended"]
    assert [e.body["reason"] for e in suspended] == ["interrupted"]
    assert verified(home, session)


@pytest.mark.anyio
async def test_the_deadline_ends_an_exponential_output_schema_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's time is an injected clock that stands still, so the deadline's time left at the
    # call is exactly the deadline, however long the server took to start on a loaded machine; and
    # the step budget is out of reach, so only that time left can end the check (were the check
    # bounded by call_timeout instead, it would run past this test's bound and fail it).
    monkeypatch.setattr(_schema, "SCHEMA_STEP_BUDGET", 10**15)
    path = answers_contract(
        tmp_path, "output_schema_that_branches_exponentially", "echo", budget='deadline = "2s"\ncall_timeout = "5m"'
    )
    contract = load_contract_text(path.read_text(encoding="utf-8"), source=str(path), environ={})
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    with anyio.fail_after(BOUND_S):
        runtime = Runtime(store=store, key=key, clock=clock, home=tmp_path / "home", connector=connect)
        outcome = await run_contract(runtime, contract)
    assert outcome.status in ("pass", "error"), outcome  # a verdict: pass (no checks) or error (the deadline)
    [call] = [e for e in store.read_session(outcome.session) if e.kind == "mcp_tool_call"]
    assert call.body["failure"]["cause"] == "invalid_result"
    shown = store.blob(call.body["result"])
    assert shown is not None and b"did not finish within the call's time (2 s)" in shown
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok


def test_a_result_nested_past_the_parser_depth_fails_at_once_instead_of_waiting_out_the_timeout(
    tmp_path: Path, home: Path
) -> None:
    # The call's timeout is longer than this test's bound: only a failure at once finishes in time.
    contract = answers_contract(tmp_path, "result_nested_past_the_parser_depth", "deep", budget='call_timeout = "10m"')
    done = run(home, contract)
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    call = the_call(home, session)
    assert call.body["failure"]["cause"] == "invalid_result"
    assert call.body["duration_ms"] < BOUND_S * 1000
    assert verified(home, session)


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["huge_one_line_result", "huge_one_line_result_with_its_id_last"])
def test_a_fifty_megabyte_one_line_result_is_refused_as_too_large_not_timed_out(
    tmp_path: Path, home: Path, attack: str
) -> None:
    contract = answers_contract(tmp_path, attack, "big", budget='call_timeout = "40s"\nmax_result_bytes = 1048576')
    done = run(home, contract)
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"]["cause"] == "result_too_large"
    assert verified(home, session)


# -- results the ledger cannot record ----------------------------------------------------------------


def test_a_result_nested_just_under_the_ledger_depth_fails_as_invalid_result_and_the_run_finishes(
    tmp_path: Path, home: Path
) -> None:
    contract = answers_contract(tmp_path, "result_nested_just_under_the_ledger_depth", "deep")
    done = run(home, contract)
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"]["cause"] == "invalid_result"
    assert [e.kind for e in entries(home, session)][-2:] == ["verdict", "session_ended"]
    assert verified(home, session)


@pytest.mark.parametrize(
    "attack",
    [
        "result_with_an_integer_beyond_i_json",
        "result_with_an_integer_at_2_53",
        "result_with_a_double_printing_as_digits_beyond_2_53",
        "result_with_a_float_beyond_double_range",
        "result_with_nan",
    ],
)
def test_a_number_the_ledger_cannot_record_is_a_recorded_failure_not_an_internal_error(
    tmp_path: Path, home: Path, attack: str
) -> None:
    done = run(home, answers_contract(tmp_path, attack, "number"))
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"]["cause"] == "invalid_result"
    assert verified(home, session)


# -- server errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [-32000, -32001])
def test_a_server_json_rpc_error_is_recorded_as_a_server_error_with_its_code(
    tmp_path: Path, home: Path, code: int
) -> None:
    done = run(home, answers_contract(tmp_path, f"server_error_minus_{-code}", "echo"))
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"] == {"cause": "server_error", "code": code, "retryable": False}


def test_a_server_error_code_the_ledger_cannot_record_is_a_server_error_recorded_without_it(
    tmp_path: Path, home: Path
) -> None:
    done = run(home, answers_contract(tmp_path, "server_error_with_a_code_at_2_53", "echo"))
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    session = json.loads(done.stdout)["session"]
    assert the_call(home, session).body["failure"] == {"cause": "server_error", "retryable": False}
    assert verified(home, session)


def test_a_server_info_member_the_ledger_cannot_record_does_not_stop_the_run(tmp_path: Path, home: Path) -> None:
    done = run(home, answers_contract(tmp_path, "server_info_holding_an_integer_at_2_53", "echo"))
    assert "internal error" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    [started] = [e for e in entries(home, session) if e.kind == "session_started"]
    assert started.body["servers"]["hostile"]["server_info"]["name"] == "big"
    assert verified(home, session)


# -- secrets ---------------------------------------------------------------------------------------------


def test_a_server_echoing_its_own_secret_in_its_server_info_gets_it_recorded_nowhere(
    tmp_path: Path, home: Path
) -> None:
    contract = answers_contract(tmp_path, "server_info_holding_its_own_secret", "echo",
                                server_extra='secret_env = ["HOSTILE_SECRET"]')  # fmt: skip
    env = {"HOSTILE_SECRET": SECRET}
    done = run(home, contract, env=env)
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    [started] = [e for e in entries(home, session) if e.kind == "session_started"]
    assert started.body["servers"]["hostile"]["server_info"]["name"] == "leaky-[redacted]"
    assert "[redacted]" in started.body["servers"]["hostile"]["instructions"]
    bundle = tmp_path / "bundle.json"
    assert cli(home, "ledger", "export", session, "--output", str(bundle)).returncode == 0
    shown = cli(home, "--json", "ledger", "show", session)
    assert shown.returncode == 0 and SECRET not in shown.stdout
    assert files_containing(home, SECRET.encode()) == []
    assert SECRET not in bundle.read_text(encoding="utf-8")
    for command in (["mcp", "list", str(contract)], ["mcp", "probe", "--contract", str(contract), "hostile"]):
        for flags in ([], ["--json"]):
            listed = truss(home, *flags, *command, env=env)
            assert listed.returncode == 0, listed.stderr
            assert SECRET not in listed.stdout + listed.stderr
            assert "[redacted]" in listed.stdout


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_secret_argument_printed_by_the_server_on_its_stderr_is_scrubbed_from_the_log_and_the_echo(
    tmp_path: Path, home: Path, verbose: bool
) -> None:
    contract = answers_contract(tmp_path, "server_that_prints_its_arguments", "login",
                                arguments='{ user = "ann", password = "${env.LOGIN_PASSWORD}" }',
                                server_extra='secret_args = ["password"]')  # fmt: skip
    done = run(home, contract, *(["-v"] if verbose else []), env={"LOGIN_PASSWORD": SECRET})
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    log = (home / "logs" / session / "hostile.stderr.log").read_text(encoding="utf-8")
    assert '"password": "[redacted]"' in log and '"user": "ann"' in log
    assert SECRET not in done.stdout + done.stderr
    assert files_containing(home, SECRET.encode()) == []


def test_every_server_answer_file_is_played_by_a_test() -> None:
    played = {
        "catastrophic_regex_in_output_schema_pattern", "catastrophic_regex_in_output_schema_pattern_properties",
        "catastrophic_regex_in_output_schema_property_names", "output_schema_that_branches_exponentially",
        "result_nested_past_the_parser_depth", "huge_one_line_result", "huge_one_line_result_with_its_id_last",
        "result_nested_just_under_the_ledger_depth", "result_with_an_integer_beyond_i_json",
        "result_with_an_integer_at_2_53", "result_with_a_double_printing_as_digits_beyond_2_53",
        "server_error_with_a_code_at_2_53", "server_info_holding_an_integer_at_2_53",
        "result_with_a_float_beyond_double_range", "result_with_nan", "server_error_minus_32000",
        "server_error_minus_32001", "server_info_holding_its_own_secret", "server_that_prints_its_arguments",
    }  # fmt: skip
    assert {p.stem for p in SERVERS.glob("*.json")} == played
    assert os.path.exists(ANSWERS)


def test_a_task_id_holding_the_servers_own_secret_is_refused_and_recorded_nowhere(tmp_path: Path, home: Path) -> None:
    env = {
        "COUNT_FILE": str(tmp_path / "count.txt"),
        "TASK_FILE": str(tmp_path / "tasks.json"),
        "TASK_DONE_FILE": str(tmp_path / "done"),
        "TASK_ID_FILE": str(DATA / "task_id_holding_the_servers_secret.json"),
    }
    contract = tmp_path / "tasks.toml"
    contract.write_text(
        f"""
[contract]
name = "tasks"
intent = "build"
[done]
pass_without_checks = true  # this test is about what is recorded, not the verdict
[[agent.steps]]
tool = "mcp:tk:build"
arguments = {{ key = "k" }}
[[mcp.servers]]
name = "tk"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TASKS_SERVER))}]
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}
secret_env = ["TK_TOKEN"]
allow_tools = ["build"]
connect_timeout = "60s"
""",
        encoding="utf-8",
    )
    done = run(home, contract, env={"TK_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    call = the_call(home, session)
    assert call.body["failure"]["cause"] == "protocol_error" and "task" not in call.body
    assert "mcp_tool_pending" not in [e.kind for e in entries(home, session)]
    assert files_containing(home, SECRET.encode()) == []
    assert SECRET not in done.stdout + done.stderr
