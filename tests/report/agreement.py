"""The harness that checks the page against ``truss ledger verify --bundle``: the report page of a
valid case is written by ``truss ledger report``, and each case is opened through the page's file
field and checked by the CLI as a subprocess. It decides nothing about which cases exist."""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.report.bundles import Case
from tests.report.cdp import Page
from tests.report.support import choose_bundle_file, open_report, truss


def _cli(case: Case, home: Path) -> dict[str, Any]:
    done = truss(home, "ledger", "verify", "--bundle", str(case.path), "--trusted-key", case.vkey, "--json")
    report: dict[str, Any] = json.loads(done.stdout)
    report["exit"] = done.returncode
    return report


def _report_page(case: Case, home: Path, out: Path) -> Path:
    done = truss(home, "ledger", "report", "--bundle", str(case.path), "--trusted-key", case.vkey, "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _compare(page: Page, cases: list[Case], home: Path) -> list[str]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        expected = list(pool.map(functools.partial(_cli, home=home), cases))
    differences: list[str] = []
    for case, cli in zip(cases, expected, strict=True):
        seen = choose_bundle_file(page, case.path)
        want = (cli["ok"], cli.get("step"), cli.get("reason"), cli.get("seq"), cli.get("index"), cli["exit"])
        got = (
            seen["ok"],
            seen["step"],
            seen["reason"],
            seen["seq"],
            seen["index"],
            seen["exit"] if not seen["ok"] else 0,
        )
        if want != got:
            differences.append(f"{case.name}: truss ledger verify {want}, the page {got} ({seen['message']})")
    return differences


def page_against_cli(page: Page, cases: list[Case], valid: str, home: Path) -> tuple[bool, list[str]]:
    """Open the report page of the case whose name ends with ``valid``, then every case through its
    file field: whether the page verified that case on opening, and each case where the page and
    ``truss ledger verify`` differ (verified or not, step, reason, seq, index, exit class)."""
    case = next(c for c in cases if c.name.endswith(valid))
    report = _report_page(case, home, home / "page.html")
    opened = open_report(page, report)["ok"] is True
    return opened, _compare(page, cases, home)
