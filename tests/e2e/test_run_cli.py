"""``truss run`` end to end, as a user runs it: subprocesses, real stdio servers, a fresh TRUSS_HOME.

mcp-server-time and mcp-server-git are the third-party peers (``make peers``); ``servers/tools.py``
is a small wire-level server for the cases the peers cannot show (a slow call, a write that needs
approval, a server that reports whether it received a secret).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, peers_path_env, python_peer, truss_cmd
from tests.gate.support import files_containing
from truss.ledger.keys import IdentityKey

TOOLS_SERVER = Path(__file__).resolve().parent / "servers" / "tools.py"
HELLO = REPO / "contracts" / "hello.toml"
TIMEOUT = 60


def truss(
    home: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = peers_path_env()
    environ["TRUSS_HOME"] = str(home)
    environ.update(env or {})
    return subprocess.run(
        [*truss_cmd(), *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd or REPO,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An initialised home; the key is made in-process (``truss init`` itself runs in the demo test)."""
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    IdentityKey.create(path / "identity.key")
    return path


def tools_contract(tmp_path: Path, body: str, *, name: str = "e2e", server_extra: str = "") -> Path:
    """A contract around ``servers/tools.py`` started by this interpreter."""
    text = f"""
[contract]
name = "{name}"
intent = "end to end"
{body}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS_SERVER))}]
allow_tools = ["echo", "slow", "write", "has_env"]
connect_timeout = "20s"
{server_extra}
"""
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.peers
def test_the_readme_demo_from_a_fresh_home_passes_and_its_ledger_verifies(tmp_path: Path) -> None:
    python_peer("mcp-server-time")
    home = tmp_path / "fresh"
    assert truss(home, "init").returncode == 0
    empty = truss(home, "sessions")
    assert empty.returncode == 0 and empty.stdout.strip() == "no sessions"
    run = truss(home, "run", "contracts/hello.toml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict     pass" in run.stdout and "checks      4/4 passed" in run.stdout
    assert "truss ledger verify" in run.stdout
    progress = [line for line in run.stderr.splitlines() if "mcp:time:" in line]
    assert len(progress) == 2 and all(" ok " in line and "left: tool_calls" in line for line in progress)
    assert "Traceback" not in run.stderr
    verify = truss(home, "ledger", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.peers
def test_run_json_prints_one_document_with_the_verdict_and_anchor(home: Path) -> None:
    python_peer("mcp-server-time")
    run = truss(home, "run", str(HELLO), "--param", "target_zone=Europe/Paris", "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["status"] == "pass" and doc["exit_code"] == 0
    assert doc["verdict"]["status"] == "pass" and len(doc["verdict"]["checks"]) == 4
    assert len(doc["head"]) == 64 and doc["checkpoint"].startswith("truss.local/")
    listing = json.loads(truss(home, "sessions", "--json").stdout)
    assert [s["status"] for s in listing["sessions"]] == ["pass"]


@pytest.mark.peers
def test_a_check_that_fails_gives_verdict_fail_and_exit_1(home: Path, tmp_path: Path) -> None:
    python_peer("mcp-server-time")
    variant = tmp_path / "hello-mars.toml"
    variant.write_text(HELLO.read_text(encoding="utf-8").replace('regex = "^UTC$"', 'regex = "^Mars/Olympus$"', 1))
    run = truss(home, "run", str(variant))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verdict     FAIL" in run.stdout and "FAIL result_matches" in run.stdout


def test_a_contract_holding_a_large_integral_float_is_refused_before_it_runs(home: Path, tmp_path: Path) -> None:
    """``1e20`` would be recorded as plain digits in session_started, which every JSON reader takes for
    an integer outside I-JSON's range: no independent RFC 8785 verifier could rebuild that entry."""
    variant = tmp_path / "hello-big.toml"
    rule = 'reason = "time lookups are harmless"\n'
    text = HELLO.read_text(encoding="utf-8")
    assert rule in text
    bounded = '\n[[policy.rules]]\ntool = "mcp:time:unused"\neffect = "deny"\nargs = { n = { max = 1e20 } }\n'
    variant.write_text(text.replace(rule, rule + bounded, 1))
    run = truss(home, "run", str(variant))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "policy.rules[1].args.n.max" in run.stderr
    assert truss(home, "sessions", "--json").stdout.count('"session"') == 0


@pytest.mark.slow
@pytest.mark.peers
def test_git_triage_against_mcp_server_git_in_a_temporary_repository(home: Path, tmp_path: Path) -> None:
    python_peer("mcp-server-git")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True, timeout=30)
    (repo / "notes.txt").write_text("one\n")
    subprocess.run([*git, "add", "notes.txt"], cwd=repo, check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "first"], cwd=repo, check=True, timeout=30)
    (repo / "notes.txt").write_text("one\ntwo\n")
    run = truss(home, "run", str(REPO / "contracts" / "git-triage.toml"), env={"REPO": str(repo)}, cwd=repo)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks      4/4 passed" in run.stdout


@pytest.mark.slow
def test_a_deadline_that_expires_during_a_call_gives_verdict_error_and_exit_4(home: Path, tmp_path: Path) -> None:
    body = """
[agent]
[[agent.steps]]
tool = "mcp:tools:slow"
arguments = { seconds = 30 }
[budget]
deadline = "2s"
"""
    run = truss(home, "run", str(tools_contract(tmp_path, body)), "--json")
    assert run.returncode == 4, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["status"] == "error" and doc["verdict"]["error"]["cause"] == "deadline"
    assert truss(home, "ledger", "verify").returncode == 0


APPROVAL_BODY = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "before" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "out.txt", text = "hello" }
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:tools:write"
effect = "ask"
reason = "writes need a person"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:write"
"""


@pytest.mark.slow
def test_approval_suspends_with_exit_3_then_approve_and_resume_finish_the_run(home: Path, tmp_path: Path) -> None:
    contract = tools_contract(tmp_path, APPROVAL_BODY)
    run = truss(home, "run", str(contract), "--session", "approve-me")
    assert run.returncode == 3, run.stdout + run.stderr
    assert "truss approve approve-me c2.0" in run.stdout and "truss resume approve-me" in run.stdout
    approve = truss(home, "approve", "approve-me", "c2.0", "--reason", "checked by hand")
    assert approve.returncode == 0, approve.stderr
    resumed = truss(home, "resume", "approve-me")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "verdict     pass" in resumed.stdout
    assert "(replayed)" in resumed.stderr  # the echo of the first leg came from the ledger
    assert truss(home, "ledger", "verify", "approve-me").returncode == 0
    again = truss(home, "run", str(contract), "--session", "approve-me")
    assert again.returncode == 0 and "already exists" in again.stdout


@pytest.mark.slow
def test_ctrl_c_records_the_run_as_interrupted_and_exits_3(home: Path, tmp_path: Path) -> None:
    body = """
[agent]
[[agent.steps]]
tool = "mcp:tools:slow"
arguments = { seconds = 30 }
"""
    environ = peers_path_env()
    environ["TRUSS_HOME"] = str(home)
    proc = subprocess.Popen(
        [*truss_cmd(), "-v", "run", str(tools_contract(tmp_path, body)), "--session", "ctrl-c"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=REPO,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the first model turn is recorded just before the slow call starts
            if "model turn 1" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 3, out + err
    assert "interrupted" in out and "truss resume ctrl-c" in out
    assert "Traceback" not in err
    listing = json.loads(truss(home, "sessions", "--json").stdout)
    assert [s["status"] for s in listing["sessions"]] == ["interrupted"]
    assert truss(home, "ledger", "verify", "ctrl-c").returncode == 0


def test_a_canary_secret_appears_nowhere_under_home_nor_in_the_output(home: Path, tmp_path: Path) -> None:
    token, argument = "canary-env-6d1f0e2a9b", "canary-arg-41c7be55d0"
    body = """
[agent]
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "${env.CANARY_ARG}" }
[[agent.steps]]
tool = "mcp:tools:has_env"
arguments = { name = "CANARY_TOKEN" }
[[done.checks]]
kind = "result_matches"
tool = "mcp:tools:has_env"
pointer = ""
regex = "^yes$"
"""
    contract = tools_contract(tmp_path, body, server_extra='secret_env = ["CANARY_TOKEN"]\nsecret_args = ["text"]')
    env = {"CANARY_TOKEN": token, "CANARY_ARG": argument}
    run = truss(home, "-v", "run", str(contract), "--session", "canary", env=env)
    assert run.returncode == 0, run.stdout + run.stderr  # the server did receive the secret
    shown = truss(home, "ledger", "show", "canary")
    assert shown.returncode == 0, shown.stderr
    outputs = [run.stdout, run.stderr, shown.stdout, shown.stderr]
    for secret in (token, argument):
        assert files_containing(home, secret.encode()) == []
        assert all(secret not in text for text in outputs)


@pytest.mark.parametrize(
    ("args", "setup"),
    [
        (["run", "no-such-contract.toml"], None),
        (["run", "{contract}", "--session", "bad id with spaces"], None),
        (["approve", "s_missing", "c1.0"], None),
        (["run", "{contract}"], "remove-key"),
    ],
)
def test_bad_input_is_one_paragraph_exit_2_and_no_traceback(home: Path, args: list[str], setup: str | None) -> None:
    if setup == "remove-key":
        (home / "identity.key").unlink()
    run = truss(home, *[a.replace("{contract}", str(HELLO)) for a in args])
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and run.stderr.startswith("truss")
    assert len(run.stderr.strip().splitlines()) == 1


if os.name != "posix":  # signals and process groups as used here are POSIX
    pytestmark = pytest.mark.skip(reason="POSIX only")
