"""A done check's regex that backtracks exponentially on a tool's result used to hang the run.

``regex = "^(x+)+y$"`` against a result of 34 x's ran for ever on Python's ``re`` (the event loop
blocked: SIGTERM was caught and never acted on, the deadline never fired). Done checks now run
on RE2 (``truss._regex.linear_regex``), linear in the text whatever the pattern, and a pattern RE2
cannot run is refused by ``contract check``, before any run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, truss_cmd
from tests.durability.support import cli
from tests.security._support import DATA, HERE

ANSWERS = HERE / "servers" / "answers.py"
ATTACK = DATA / "results" / "result_of_34_xs_against_a_catastrophic_done_check.json"
BOUND_S = 60  # the old code never finished; the new one takes a few seconds


def _contract(tmp_path: Path, regex: str) -> Path:
    text = f"""
[contract]
name = "catastrophic-check"
intent = "security test"
[budget]
deadline = "30s"
[[agent.steps]]
tool = "mcp:hostile:echo"
arguments = {{ text = "hi" }}
[[mcp.servers]]
name = "hostile"
command = {json.dumps(sys.executable)}
args = {json.dumps([str(ANSWERS), str(ATTACK)])}
allow_tools = ["echo"]
connect_timeout = "20s"
[[done.checks]]
kind = "result_matches"
tool = "mcp:hostile:echo"
regex = {json.dumps(regex)}
"""
    path = tmp_path / "catastrophic-check.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": "/usr/bin:/bin", "TRUSS_HOME": str(home), "PYTHONUTF8": "1"}
    return subprocess.run([*truss_cmd(), *args], capture_output=True, text=True, encoding="utf-8", env=environ,
                          cwd=REPO, timeout=BOUND_S, check=False)  # fmt: skip


def test_a_catastrophic_done_check_regex_against_34_xs_reaches_a_verdict(tmp_path: Path, home: Path) -> None:
    done = _truss(home, "--json", "run", str(_contract(tmp_path, "^(x+)+y$")))
    report = json.loads(done.stdout)
    assert report["verdict"]["status"] == "fail", done.stderr
    assert cli(home, "ledger", "verify", report["session"]).returncode == 0


def test_a_done_check_regex_that_holds_on_the_result_still_passes(tmp_path: Path, home: Path) -> None:
    done = _truss(home, "--json", "run", str(_contract(tmp_path, "^(x+)+$")))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"]["status"] == "pass"


@pytest.mark.parametrize("regex", ["(?=x)x+", "(x)\\1", "x(?<!y)"], ids=["lookahead", "backreference", "lookbehind"])
def test_a_done_check_regex_that_needs_backtracking_is_refused_by_contract_check(
    tmp_path: Path, home: Path, regex: str
) -> None:
    done = _truss(home, "contract", "check", str(_contract(tmp_path, regex)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "done.checks" in done.stderr and "linear time" in done.stderr
    assert "Traceback" not in done.stderr
