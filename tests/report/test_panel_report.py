"""A report of a session with a reviewer panel, in a real headless Chromium: the claims, what they cite,
Truss's findings and each reviewer's answer are shown, as text, and every entry verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, truss_cmd
from tests.report.cdp import Page
from tests.report.support import open_report, text_of, timeline

TOOLS = REPO / "tests" / "e2e" / "servers" / "tools.py"
TIMEOUT = 120
MARKUP = "<img src=x onerror=\"document.title='claim'\">"


def _truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*truss_cmd(), "--home", str(home), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=TIMEOUT, check=False)  # fmt: skip


def _session(home: Path, work: Path, session: str, final: str) -> None:
    path = work / f"{session}.toml"
    path.write_text(
        f"""
[contract]
name = "panel-report"
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
quorum = 2
[[done.checks.reviewers]]
name = "ann"
provider = "scripted"
judge = "supported"
[[done.checks.reviewers]]
name = "bo"
provider = "scripted"
judge = "unsupported"
[[done.checks.reviewers]]
name = "cy"
provider = "scripted"
judge = "supported"
""",
        encoding="utf-8",
    )
    done = _truss(home, "run", str(path), "--session", session)
    assert done.returncode in (0, 1), done.stdout + done.stderr


@pytest.mark.slow
def test_a_report_shows_the_panels_claims_citations_findings_and_reviewers_as_text(page: Page, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _truss(home, "init").returncode == 0
    _session(home, tmp_path, "reviewed", f"The echo said hello {MARKUP} [c1.0].")
    _session(home, tmp_path, "cited-wrong", "The echo said hello [c1.0]. It wrote a file [c2.0].")

    out = tmp_path / "reviewed.html"
    assert _truss(home, "ledger", "report", "reviewed", "-o", str(out)).returncode == 0
    assert open_report(page, out)["ok"] is True
    assert page.evaluate("document.querySelector('#verdict .panel').dataset.outcome") == "approved"
    claim = text_of(page, "#verdict .panel table.claims tbody tr")
    assert MARKUP in claim and "c1.0 (ok, seq 3)" in claim
    reviewers = page.evaluate(
        "[...document.querySelectorAll('#verdict .panel table.reviewers tbody tr')]"
        ".map(tr => [tr.dataset.reviewer, tr.dataset.outcome])"
    )
    assert reviewers == [["ann", "approve"], ["bo", "reject"], ["cy", "approve"]]
    rows = [r for r in timeline(page) if r["kind"] == "panel_review"]
    assert [r["outcome"] for r in rows] == ["approve", "reject", "approve"]
    assert all(r["verification"] == "\u2713 verified" for r in rows)
    assert page.evaluate("document.images.length") == 0
    assert page.evaluate("document.title") == "Truss report: session reviewed"

    out = tmp_path / "cited-wrong.html"
    assert _truss(home, "ledger", "report", "cited-wrong", "-o", str(out)).returncode == 0
    assert open_report(page, out)["ok"] is True
    assert page.evaluate("document.querySelector('#verdict .panel').dataset.outcome") == "findings"
    findings = text_of(page, "#verdict .panel ul.findings")
    assert "unknown_call: claim 1 cites c2.0, which the session does not have" in findings
    assert "c2.0 (not in the session)" in text_of(page, "#verdict .panel table.claims")
    assert page.requests() == [report.resolve().as_uri() for report in (tmp_path / "reviewed.html", out)]
