"""The page and ``truss ledger verify --bundle`` agree on every tampered bundle of the test suite.

One report page per trusted key; each tampered bundle is opened through the page's file field (the
way an auditor checks another bundle), and the same file is checked by the CLI as a subprocess.
Both must give the same result: verified or not, the step, the reason, the entry (seq and log
index) and the exit class (1 does not verify, 2 unusable).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.report.agreement import page_against_cli
from tests.report.bundles import bundle_cases, chain_cases
from tests.report.cdp import Page
from tests.report.support import choose_bundle_file


@pytest.mark.slow
def test_the_page_and_the_cli_agree_on_every_tampered_bundle_and_input_quirk(page: Page, tmp_path: Path) -> None:
    cases = bundle_cases()
    assert len(cases) >= 35  # the bundle fixtures and the page's own are all found
    opened, differences = page_against_cli(page, cases, "tampered_bundles/original", tmp_path)
    assert opened
    assert differences == []


@pytest.mark.slow
def test_the_page_and_the_cli_agree_on_every_tampered_chain_put_into_a_bundle(page: Page, tmp_path: Path) -> None:
    cases = chain_cases(tmp_path)
    assert len(cases) >= 13
    opened, differences = page_against_cli(page, cases, "clean_session", tmp_path)
    assert opened
    assert differences == []
    # The chain fixtures say what catches each attack; as bundles the same step names the same entry.
    for case in cases:
        fixture = json.loads((REPO / "tests" / "ledger" / "tampered" / case.path.name).read_text(encoding="utf-8"))
        seen = choose_bundle_file(page, case.path)
        expect = fixture["expect"]
        assert seen["ok"] is expect["ok"], case.name
        if not expect["ok"]:
            assert (seen["reason"], seen["seq"]) == (expect["reason"], expect["seq"]), case.name
            assert seen["statuses"][seen["position"]] == "failed", case.name
