"""Fixtures of the report tests: one headless Chromium for the run, and real sessions made by ``truss run``.

The browser is Debian's ``chromium`` (the Makefile installs it with apt-get when run as root). A
test that needs it is skipped when it is missing, with what to install, except under CI (``CI``
set), where it fails: a green CI always means the page was checked in a real browser.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.report.cdp import Browser, Page, find_chromium
from tests.report.sessions import make_sessions


def _chromium() -> str:
    found = find_chromium()
    if found is None:
        message = "Debian's chromium is not installed: run `apt-get install chromium` (`make test` does it as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with Browser(_chromium(), timeout=60) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    tab = browser.page()
    yield tab
    tab.close()


@pytest.fixture(scope="session")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home holding the sessions of ``tests.report.sessions`` (made once for the whole run)."""
    root = tmp_path_factory.mktemp("report-sessions")
    home = root / "home"
    home.mkdir(mode=0o700)
    work = root / "work"
    work.mkdir()
    make_sessions(home, work)
    return home
