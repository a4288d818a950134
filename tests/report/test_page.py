"""The report file itself, without a browser: self-contained, locked down, and carrying the exact bundle."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.ledger._fixtures import golden_key
from tests.ledger.test_bundle import TAMPERED as TAMPERED_BUNDLES
from tests.ledger.test_bundle import log_key
from truss.ledger.bundle import export_bundle
from truss.ledger.entry import Record
from truss.report.page import build_report
from truss.testing import ManualClock, MemoryStore

ASSETS = Path(__file__).resolve().parents[2] / "truss" / "report" / "assets"
ORIGINAL = (TAMPERED_BUNDLES / "original.json").read_bytes()
VKEY = log_key().verifier.vkey


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.styles: list[str] = []
        self._open: tuple[str, dict[str, str | None]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._open = (tag, dict(attrs))

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            tag, attrs = self._open
            if tag == "script":
                self.scripts.append((attrs, data))
            else:
                self.styles.append(data)
            self._open = None


def _parse(html_text: str) -> _Elements:
    parsed = _Elements()
    parsed.feed(html_text)
    return parsed


def _csp(parsed: _Elements) -> dict[str, list[str]]:
    [policy] = [
        a["content"] for t, a in parsed.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert policy is not None
    out: dict[str, list[str]] = {}
    for directive in policy.split(";"):
        name, *values = directive.split()
        out[name] = values
    return out


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_page_forbids_every_fetch_and_runs_only_its_own_inline_script_and_style() -> None:
    parsed = _parse(build_report(ORIGINAL, [VKEY], truss_version="test").html)
    csp = _csp(parsed)
    assert csp["default-src"] == ["'none'"]
    for directive in ("connect-src", "img-src", "font-src", "frame-src", "object-src", "form-action", "base-uri"):
        assert csp[directive] == ["'none'"], directive
    [code] = [text for attrs, text in parsed.scripts if "type" not in attrs]
    assert csp["script-src"] == [_digest(code)]
    assert csp["style-src"] == [_digest(parsed.styles[0])]
    # The policy is the first thing in the head, before any script or style can run.
    assert [t for t, _ in parsed.tags][:3] == ["html", "head", "meta"]
    assert parsed.tags[3][1].get("http-equiv") == "Content-Security-Policy"


def test_the_page_names_nothing_to_load_from_anywhere() -> None:
    text = build_report(ORIGINAL, [VKEY], truss_version="test").html
    parsed = _parse(text)
    assert not [(t, a) for t, a in parsed.tags if {"src", "href", "srcset", "action", "poster"} & set(a)]
    assert not [t for t, _ in parsed.tags if t in ("link", "iframe", "img", "object", "embed", "base")]
    css = (ASSETS / "report.css").read_text(encoding="utf-8")
    assert "url(" not in css and "@import" not in css and "@font-face" not in css


def test_the_page_carries_the_exact_bytes_of_the_bundle() -> None:
    odd = ORIGINAL + b"\n\n"  # bytes a verifier must see as they are, not a re-encoding of them
    parsed = _parse(build_report(odd, [VKEY], truss_version="test").html)
    [data] = [text for attrs, text in parsed.scripts if attrs.get("id") == "truss-bundle"]
    assert base64.b64decode("".join(data.split())) == odd


def test_the_script_never_writes_html_or_evaluates_text() -> None:
    code = (ASSETS / "report.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", "srcdoc",
                 "setTimeout(", "setInterval(", "fetch(", "XMLHttpRequest", "WebSocket", "import("):  # fmt: skip
        assert sink not in code, sink
    assert "</script" not in code.lower() and "</style" not in (ASSETS / "report.css").read_text().lower()


def _bundle_with_reason(reason: str) -> bytes:
    key = golden_key()
    store = MemoryStore(key=key, clock=ManualClock())
    store.append("s_x", [Record("session_started", {"contract": "x", "pins": {}, "effective": {}})])
    store.append(
        "s_x", [Record("mcp_tool_denied", {"call": "c1.0", "tool": "mcp:a:b", "code": "rule", "reason": reason})]
    )
    store.append("s_x", [Record("session_ended", {"status": "fail"})])
    return export_bundle(store, "s_x", vkey=key.verifier.vkey, signer=key)


@pytest.mark.parametrize(
    "reason",
    ["</script><script>alert(1)</script>", "<!-- <script>", "@SCRIPT@ @CONFIG@ @BUNDLE@", "]]></x>&amp;\u2028\u2029"],
)
def test_untrusted_text_in_the_embedded_decision_paths_cannot_leave_its_data_block(reason: str) -> None:
    page = build_report(_bundle_with_reason(reason), [golden_key().verifier.vkey], truss_version="test")
    parsed = _parse(page.html)
    assert len(parsed.scripts) == 3  # config, bundle, code: nothing the text could have opened
    [config] = [text for attrs, text in parsed.scripts if attrs.get("id") == "truss-config"]
    assert "<" not in config and ">" not in config and "&" not in config
    decoded: dict[str, Any] = json.loads(config)
    steps = decoded["derived"]["calls"]["c1.0"]["steps"]
    assert any(reason in step["text"] for step in steps)
    # One pass over the template: a marker inside data stays data, and the code is the code.
    [code] = [text for attrs, text in parsed.scripts if "type" not in attrs]
    assert code == (ASSETS / "report.js").read_text(encoding="utf-8")


def test_the_same_bundle_and_keys_make_the_same_page() -> None:
    assert (
        build_report(ORIGINAL, [VKEY], truss_version="t").html == build_report(ORIGINAL, [VKEY], truss_version="t").html
    )


def test_a_bundle_that_does_not_parse_still_makes_a_page_without_decision_paths() -> None:
    page = build_report(b'{"format": "truss-bundle", ', [VKEY], truss_version="test")
    [config] = [text for attrs, text in _parse(page.html).scripts if attrs.get("id") == "truss-config"]
    assert json.loads(config)["derived"] is None and page.session is None


def test_the_page_is_told_the_entry_kinds_of_this_version_of_truss() -> None:
    from truss.ledger.entry import KINDS

    [config] = [
        t
        for a, t in _parse(build_report(ORIGINAL, [VKEY], truss_version="t").html).scripts
        if a.get("id") == "truss-config"
    ]
    assert json.loads(config)["kinds"] == sorted(KINDS)
    assert re.search(r"const KINDS = new Set\(config\.kinds\)", (ASSETS / "report.js").read_text(encoding="utf-8"))
