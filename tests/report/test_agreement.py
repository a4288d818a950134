"""The page and ``truss ledger verify --bundle`` agree on every tampered bundle of the test suite.

One report page per trusted key; each tampered bundle is opened through the page's file field (the
way an auditor checks another bundle), and the same file is checked by the CLI as a subprocess.
Both must give the same result: verified or not, the step, the reason, the entry (seq and log
index) and the exit class (1 does not verify, 2 unusable).
"""

from __future__ import annotations

import functools
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, truss_cmd
from tests.report.bundles import Case, bundle_cases, chain_cases
from tests.report.cdp import Page
from tests.report.support import choose_bundle_file, open_report

TIMEOUT = 120


def _cli(case: Case, home: Path) -> dict[str, Any]:
    done = subprocess.run(
        [
            *truss_cmd(),
            "--home",
            str(home),
            "ledger",
            "verify",
            "--bundle",
            str(case.path),
            "--trusted-key",
            case.vkey,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=TIMEOUT,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    report["exit"] = done.returncode
    return report


def _report_page(case: Case, source: Path, home: Path, out: Path) -> Path:
    done = subprocess.run(
        [
            *truss_cmd(),
            "--home",
            str(home),
            "ledger",
            "report",
            "--bundle",
            str(source),
            "--trusted-key",
            case.vkey,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=TIMEOUT,
        check=False,
    )
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


@pytest.mark.slow
def test_the_page_and_the_cli_agree_on_every_tampered_bundle_and_input_quirk(page: Page, tmp_path: Path) -> None:
    cases = bundle_cases()
    assert len(cases) >= 35  # the bundle fixtures and the page's own are all found
    original = next(c for c in cases if c.name.endswith("tampered_bundles/original"))
    report = _report_page(original, original.path, tmp_path, tmp_path / "page.html")
    assert open_report(page, report)["ok"] is True
    assert _compare(page, cases, tmp_path) == []


@pytest.mark.slow
def test_the_page_and_the_cli_agree_on_every_tampered_chain_put_into_a_bundle(page: Page, tmp_path: Path) -> None:
    cases = chain_cases(tmp_path)
    assert len(cases) >= 13
    clean = next(c for c in cases if c.name.endswith("clean_session"))
    report = _report_page(clean, clean.path, tmp_path, tmp_path / "page.html")
    assert open_report(page, report)["ok"] is True
    assert _compare(page, cases, tmp_path) == []
    # The chain fixtures say what catches each attack; as bundles the same step names the same entry.
    for case in cases:
        fixture = json.loads((REPO / "tests" / "ledger" / "tampered" / case.path.name).read_text(encoding="utf-8"))
        seen = choose_bundle_file(page, case.path)
        expect = fixture["expect"]
        assert seen["ok"] is expect["ok"], case.name
        if not expect["ok"]:
            assert (seen["reason"], seen["seq"]) == (expect["reason"], expect["seq"]), case.name
            assert seen["statuses"][seen["position"]] == "failed", case.name
