"""``truss ledger show`` shows a panel's claims, citations, findings and each reviewer's answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.durability.support import make_home, truss

TOOLS = Path(__file__).resolve().parent.parent / "e2e" / "servers" / "tools.py"


def contract(directory: Path, final: str) -> Path:
    path = directory / "show.toml"
    path.write_text(
        f"""
[contract]
name = "panel-show"
intent = "Echo hello and say what came back."
[agent]
final = {json.dumps(final)}
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = {{ text = "hello" }}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS))}]
allow_tools = ["echo"]
connect_timeout = "60s"
[[done.checks]]
kind = "panel"
quorum = 1
[[done.checks.reviewers]]
name = "ann"
provider = "scripted"
answer = {{ claims = [ {{ claim = 0, judgement = "supported", calls = ["c1.0"], reason = "the echo result" }} ] }}
""",
        encoding="utf-8",
    )
    return path


def test_show_lists_the_claims_their_citations_and_each_reviewers_judgements(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    ran = truss(home, "run", str(contract(tmp_path, "The echo said hello [c1.0].")), "--session", "s1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "review ann (scripted)  approve" in ran.stderr  # the run's progress line
    shown = truss(home, "ledger", "show", "s1")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "panel (check 0): approved" in out
    assert "claim 0: 'The echo said hello' cites c1.0" in out
    assert "cited c1.0 mcp:tools:echo ok: mcp_tool_call seq 3" in out
    assert "review by ann (scripted) of check 0: approve" in out
    assert "claim 0 supported [c1.0]: the echo result" in out
    as_json = json.loads(truss(home, "ledger", "show", "s1", "--json").stdout)
    review = next(e for e in as_json["entries"] if e["kind"] == "panel_review")
    assert review["review"]["form"]["claims"][0]["reason"] == "the echo result"


def test_show_lists_a_finding_in_the_answers_citations(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    final = "The echo said hello [c1.0]. It also wrote a file [c3.1]."
    ran = truss(home, "run", str(contract(tmp_path, final)), "--session", "s1")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    out = truss(home, "ledger", "show", "s1").stdout
    assert "panel (check 0): findings" in out
    assert "finding unknown_call: claim 1 cites c3.1, which the session does not have" in out
