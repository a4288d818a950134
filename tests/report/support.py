"""What a person sees on a report page, read through the DevTools protocol, and ``truss`` run as a
user runs it to write and check one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import REPO, truss_cmd
from tests.report.cdp import Page

VERIFY_TIMEOUT = 120  # generous for a loaded machine; a report verifies in well under a second
TRUSS_TIMEOUT = 120


def truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``truss --home HOME ARGS`` as a subprocess; whatever its exit code, never a traceback."""
    done = subprocess.run(
        [*truss_cmd(), "--home", str(home), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=TRUSS_TIMEOUT,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def open_report(page: Page, path: Path) -> dict[str, Any]:
    """Open the report file and return the summary of its first verification."""
    page.open(path.resolve().as_uri(), timeout=VERIFY_TIMEOUT)
    summary: dict[str, Any] = page.evaluate("window.trussReport.after(0)", timeout=VERIFY_TIMEOUT)
    return summary


def choose_bundle_file(page: Page, path: Path, *, timeout: float = VERIFY_TIMEOUT) -> dict[str, Any]:
    """Open another bundle through the page's file field, as a person would; its verification's summary."""
    runs = page.evaluate("window.trussReport.runs")
    page.set_file("#bundle-file", path)
    summary: dict[str, Any] = page.evaluate(f"window.trussReport.after({runs})", timeout=timeout)
    return summary


def press(page: Page, button: str, *, fill: dict[str, str] | None = None) -> dict[str, Any]:
    """Type into text fields (selector -> text), press ``button``; the summary of the verification it starts."""
    runs = page.evaluate("window.trussReport.runs")
    for selector, text in (fill or {}).items():
        page.evaluate(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(text)}")
    page.evaluate(f"document.querySelector({json.dumps(button)}).click()")
    summary: dict[str, Any] = page.evaluate(f"window.trussReport.after({runs})", timeout=VERIFY_TIMEOUT)
    return summary


def text_of(page: Page, selector: str) -> str:
    value = page.evaluate(f"(document.querySelector({json.dumps(selector)}) || {{innerText: ''}}).innerText")
    return str(value)


def timeline(page: Page) -> list[dict[str, str]]:
    """The timeline's rows: seq, kind, and the text of each cell as shown."""
    rows: list[dict[str, str]] = page.evaluate(
        """[...document.querySelectorAll('#timeline tbody tr')].map(tr => ({
            pos: tr.dataset.pos, seq: tr.dataset.seq, kind: tr.dataset.kind, status: tr.dataset.status,
            event: tr.cells[2].innerText, call: tr.cells[3].innerText, tool: tr.cells[4].innerText,
            outcome: tr.cells[5].innerText, duration: tr.cells[6].innerText, verification: tr.cells[7].innerText}))"""
    )
    return rows
