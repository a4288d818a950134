"""Reports of real sessions in a real headless Chromium: what a person sees, and that nothing is fetched.

Sessions come from ``truss run`` (``tests/report/sessions.py``); reports from ``truss ledger report``
as a subprocess; the page is driven over the DevTools protocol (``tests/report/cdp.py``). A
screenshot of each report is kept under the test's tmp dir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.ledger._fixtures import golden_key
from tests.ledger.test_bundle import TAMPERED as TAMPERED_BUNDLES
from tests.ledger.test_bundle import TAMPERED_CASES, log_key, stranger_key
from tests.report.bundles import chain_cases
from tests.report.cdp import Page
from tests.report.sessions import SCRIPT_FINAL, SCRIPT_RESULT
from tests.report.support import choose_bundle_file, open_report, press, text_of, timeline, truss
from truss.ledger.bundle import export_bundle, verify_bundle
from truss.ledger.entry import KINDS, Record
from truss.ledger.keys import TrustedKeys
from truss.report.page import build_report
from truss.testing import ManualClock, MemoryStore

REPORT_TAMPERED = Path(__file__).resolve().parent / "tampered"


def _original_report(tmp_path: Path, trusted: str) -> Path:
    """The report page of the untampered bundle the attack files start from, trusting ``trusted``."""
    out = tmp_path / "original.html"
    made = truss(tmp_path, "ledger", "report", "--bundle", str(TAMPERED_BUNDLES / "original.json"),
                  "--trusted-key", trusted, "-o", str(out))  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return out


def _report(home: Path, session: str, out: Path) -> Path:
    done = truss(home, "ledger", "report", session, "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _kinds(home: Path, session: str) -> list[str]:
    shown = truss(home, "ledger", "show", session, "--json")
    assert shown.returncode == 0, shown.stderr
    return [e["kind"] for e in json.loads(shown.stdout)["entries"]]


def _screenshot(page: Page, path: Path) -> Path:
    page.evaluate("window.trussReport.expandAll()")
    height = int(page.evaluate("document.documentElement.scrollHeight"))
    shot = page.screenshot(path, full_height=min(height, 8000))
    assert shot.stat().st_size > 10_000
    return shot


def _events(rows: list[dict[str, str]]) -> list[str]:
    return [r["event"].split("\n")[0] for r in rows]


# -- real sessions -------------------------------------------------------------------------------

SESSIONS: dict[str, dict[str, Any]] = {
    "pass": {"verdict": "PASS", "events": ["session started", "model turn", "call sent", "call result", "model turn",
                                           "verdict", "session ended"]},
    "denied": {"verdict": "FAIL", "has": [("call denied", "denied (rule)", "no probing of the environment")]},
    "approval": {"verdict": "PASS", "order": ["approval requested", "session suspended", "approval decided",
                                              "session resumed", "call result"]},
    "waiting": {"verdict": None, "order": ["approval requested", "session suspended"]},
    "signal": {"verdict": "PASS", "order": ["call pending", "session suspended", "signal received", "session resumed",
                                            "call result"]},
    "doubt": {"verdict": "PASS", "order": ["call sent", "in doubt", "session suspended", "in-doubt resolved",
                                           "call result"]},
    "memo-b": {"verdict": "PASS", "has": [("call result", "ok (memo)", "")]},
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("session", sorted(SESSIONS))
def test_a_report_of_a_real_session_shows_its_timeline_and_verdict_and_verifies_every_entry(
    session: str, sessions: Path, page: Page, tmp_path: Path
) -> None:
    expect = SESSIONS[session]
    report = _report(sessions, session, tmp_path / f"{session}.html")
    summary = open_report(page, report)
    assert summary["ok"] is True, summary["message"]
    assert text_of(page, "#overall").startswith("Verified")
    rows = timeline(page)
    assert [r["kind"] for r in rows] == _kinds(sessions, session)
    assert all(r["verification"] == "\u2713 verified" for r in rows)
    events = _events(rows)
    if "events" in expect:
        assert events == expect["events"]
    if "order" in expect:
        rest = iter(events)  # each expected event, in that order, among the rows
        assert all(any(e == got for got in rest) for e in expect["order"]), events
    for event, outcome, detail in expect.get("has", []):
        assert any(r["event"].startswith(event) and r["outcome"] == outcome and detail in r["event"] for r in rows)
    verdict = text_of(page, "#verdict-status")
    if expect["verdict"] is None:
        assert verdict.startswith("No verdict yet")
    else:
        assert verdict == expect["verdict"]
    # Every call has its detail and its decision path; nothing was fetched from anywhere.
    calls = page.evaluate("[...document.querySelectorAll('#calls details.call')].map(d => d.dataset.status)")
    assert calls and all(status == "verified" for status in calls)
    # A call's panel is built when a person opens it; then it holds the call's decision path.
    opened = page.evaluate(
        """new Promise(resolve => { const panel = document.querySelector('#calls details.call');
            panel.addEventListener('toggle', () => resolve(panel.querySelector('ol.path') !== null), { once: true });
            panel.querySelector('summary').click(); })"""
    )
    assert opened is True
    page.evaluate("window.trussReport.expandAll()")
    assert page.evaluate("document.querySelectorAll('#calls ol.path').length") == len(calls)
    assert page.evaluate("document.querySelector('#budget svg polyline') !== null")
    _screenshot(page, tmp_path / f"{session}.png")
    assert page.requests() == [report.resolve().as_uri()]


@pytest.mark.slow
def test_tool_results_and_model_output_are_shown_as_text_and_never_run(
    sessions: Path, page: Page, tmp_path: Path
) -> None:
    report = _report(sessions, "pass", tmp_path / "pass.html")
    assert open_report(page, report)["ok"] is True
    page.evaluate("window.trussReport.expandAll()")
    shown = text_of(page, "#calls")
    assert SCRIPT_RESULT in shown  # the tool's text, as text
    assert "says: " + SCRIPT_FINAL in text_of(page, "#timeline")  # the model's answer, as text
    # The markup in them built nothing: no image, no script beyond the page's own three, title intact.
    assert page.evaluate("document.images.length") == 0
    assert page.evaluate("document.scripts.length") == 3
    assert page.evaluate("document.querySelectorAll('[onerror]').length") == 0
    assert page.evaluate("document.title") == "Truss report: session pass"
    assert page.requests() == [report.resolve().as_uri()]


# -- tampered bundles -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("name", "step", "reason"), TAMPERED_CASES, ids=[c[0] for c in TAMPERED_CASES])
def test_a_report_of_a_tampered_bundle_shows_not_verified_where_truss_ledger_verify_says(
    name: str, step: str, reason: str, page: Page, tmp_path: Path
) -> None:
    bundle = TAMPERED_BUNDLES / f"{name}.json"
    out = tmp_path / f"{name}.html"
    made = truss(tmp_path, "ledger", "report", "--bundle", str(bundle), "--trusted-key", log_key().verifier.vkey,
                  "-o", str(out), "--json")  # fmt: skip
    assert made.returncode == 1, made.stdout + made.stderr  # written, and it does not verify
    cli = json.loads(made.stdout)["verification"]
    summary = open_report(page, out)
    assert (summary["ok"], summary["step"], summary["reason"]) == (False, step, reason)
    overall = text_of(page, "#overall")
    assert overall.startswith("Not verified") and f"{step} ({reason})" in overall
    assert text_of(page, f"#steps tr[data-step={step}] td:last-child") == f"failed: {reason}"
    rows = timeline(page)
    if cli["seq"] is not None:
        # The entry the CLI names is the one the page marks, and every entry before it verified.
        failed = [r for r in rows if r["status"] == "failed"]
        assert [(r["seq"], r["verification"]) for r in failed] == [(str(cli["seq"]), "\u2717 not verified")]
        assert all(r["status"] == "verified" for r in rows[: int(failed[0]["pos"])])
        assert f"at entry seq {cli['seq']}" in overall
    else:
        assert not any(r["status"] == "failed" for r in rows)
    assert page.requests() == [out.resolve().as_uri()]


@pytest.mark.slow
def test_each_tampered_chain_shows_not_verified_at_the_entry_its_fixture_names(page: Page, tmp_path: Path) -> None:
    cases = chain_cases(tmp_path)
    clean = next(c for c in cases if c.name.endswith("clean_session"))
    out = tmp_path / "clean.html"
    made = truss(tmp_path, "ledger", "report", "--bundle", str(clean.path), "--trusted-key", clean.vkey, "-o", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    assert open_report(page, out)["ok"] is True
    for case in cases:
        expect = json.loads((REPO / "tests" / "ledger" / "tampered" / case.path.name).read_text(encoding="utf-8"))[
            "expect"
        ]
        summary = choose_bundle_file(page, case.path)
        rows = timeline(page)
        if expect["ok"]:
            assert summary["ok"] and all(r["status"] == "verified" for r in rows), case.name
            continue
        failed = [r for r in rows if r["status"] == "failed"]
        assert [(r["seq"], r["verification"]) for r in failed] == [(str(expect["seq"]), "\u2717 not verified")], (
            case.name
        )
        assert text_of(page, "#overall").startswith(f"Not verified at entry seq {expect['seq']}"), case.name


# -- the trusted key and other bundles ---------------------------------------------------------------


@pytest.mark.slow
def test_pasting_another_key_checks_the_same_bundle_against_it(sessions: Path, page: Page, tmp_path: Path) -> None:
    report = _report(sessions, "pass", tmp_path / "pass.html")
    assert open_report(page, report)["ok"] is True
    home_key = page.evaluate("document.querySelector('#trusted-keys').value")

    stranger = press(page, "#verify-keys", fill={"#trusted-keys": stranger_key().verifier.vkey})
    assert (stranger["ok"], stranger["step"], stranger["reason"]) == (False, "B3", "no_trusted_signature")
    assert all(r["verification"] == "\u2013 not checked" for r in timeline(page))
    assert text_of(page, "#summary .pill") == "NOT VERIFIED"

    garbled = press(page, "#verify-keys", fill={"#trusted-keys": home_key[:-6] + "AAAAAA"})
    assert garbled["ok"] is False and text_of(page, "#keys-note").startswith("Not a verifier key")

    both = press(page, "#verify-keys", fill={"#trusted-keys": stranger_key().verifier.vkey + "\n" + home_key})
    assert both["ok"] is True and text_of(page, "#overall").startswith("Verified")
    assert page.requests() == [report.resolve().as_uri()]


@pytest.mark.slow
def test_a_bundle_pasted_into_the_page_is_checked_there(sessions: Path, page: Page, tmp_path: Path) -> None:
    report = _report(sessions, "pass", tmp_path / "pass.html")
    assert open_report(page, report)["ok"] is True
    bundle = tmp_path / "denied.json"
    assert truss(sessions, "ledger", "export", "denied", "-o", str(bundle)).returncode == 0
    good = press(page, "#verify-pasted", fill={"#bundle-text": bundle.read_text(encoding="utf-8")})
    assert good["ok"] is True and good["session"] == "denied"
    assert text_of(page, "#session-id") == "denied"
    # Decision paths came with the embedded bundle only: a pasted one is shown without them.
    page.evaluate("window.trussReport.expandAll()")
    assert page.evaluate("document.querySelectorAll('#calls details.call[data-decision-path=yes]').length") == 0
    assert page.evaluate("document.querySelectorAll('#calls ol.path').length") == 0
    doc = json.loads(bundle.read_text(encoding="utf-8"))
    doc["entries"][2]["entry"]["body"]["tool"] = "mcp:tools:evil"
    bad = press(page, "#verify-pasted", fill={"#bundle-text": json.dumps(doc)})
    assert (bad["ok"], bad["reason"], bad["seq"]) == (False, "hash_mismatch", 2)
    assert page.requests() == [report.resolve().as_uri()]


@pytest.mark.parametrize("attack", ["bundle_key_with_a_million_spaces_inside", "bundle_key_behind_a_byte_order_mark"])
def test_the_key_a_bundle_names_is_read_as_python_reads_it_and_in_linear_time(
    attack: str, page: Page, tmp_path: Path
) -> None:
    trusted = log_key().verifier.vkey
    out = _original_report(tmp_path, trusted)
    assert open_report(page, out)["ok"] is True
    bundle = REPORT_TAMPERED / f"{attack}.json"
    cli = truss(tmp_path, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", trusted, "--json")
    expected = json.loads(cli.stdout)
    assert (expected["ok"], expected["vkey_trusted"]) == (True, False)
    # Python strips the key in linear time and keeps a byte-order mark: the page must do both.
    summary = choose_bundle_file(page, bundle, timeout=20)
    assert summary["ok"] is True
    shown = text_of(page, "#steps tr[data-step=B2] td:last-child")
    assert shown == "the bundle's key is not trusted (it adds no trust)"


@pytest.mark.slow
def test_a_bundle_of_a_hundred_thousand_resumptions_is_shown_in_linear_time_and_its_budget_drawn(
    page: Page, tmp_path: Path
) -> None:
    # Too large for a data file, so written here: an attack on the view, which the page builds for
    # every bundle that parses, signed or not. Each resumption looked back over every row before it
    # for its suspension (quadratic), and the budget chart spread every point into Math.max (which
    # overflows the stack past ~100,000 arguments, so the page failed instead of saying why not).
    trusted = log_key().verifier.vkey
    out = _original_report(tmp_path, trusted)
    assert open_report(page, out)["ok"] is True
    doc = json.loads((TAMPERED_BUNDLES / "original.json").read_text(encoding="utf-8"))
    budget = {"max_tool_calls": 10, "max_model_turns": 10, "max_tokens": 10, "deadline": "1h"}
    first = {"kind": "session_started", "seq": 0, "ts": 0, "body": {"effective": {"budget": budget}}}
    rows: list[dict[str, Any]] = [first]
    rows += ({"kind": "session_resumed", "seq": n, "ts": n, "body": {}} for n in range(1, 100_000))
    doc["entries"] = [{"entry": e, "hash": "0" * 64, "sig": "", "keyid": "00000000"} for e in rows]
    bundle = tmp_path / "a_hundred_thousand_resumptions.json"
    bundle.write_text(json.dumps(doc), encoding="utf-8")
    cli = json.loads(truss(tmp_path, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", trusted,
                            "--json").stdout)  # fmt: skip
    summary = choose_bundle_file(page, bundle, timeout=60)  # about 6 s with the fix, minutes without
    assert (summary["ok"], summary["step"], summary["reason"]) == (False, cli["step"], cli["reason"])
    assert page.evaluate("document.querySelectorAll('#timeline tbody tr').length") == 100_000
    assert page.evaluate("document.querySelectorAll('#budget svg polyline').length") == 4


@pytest.mark.slow
def test_the_page_shows_the_last_bundle_chosen_even_when_an_earlier_one_is_still_being_checked(
    page: Page, tmp_path: Path
) -> None:
    trusted = log_key().verifier.vkey
    out = _original_report(tmp_path, trusted)
    assert open_report(page, out)["ok"] is True
    # A bundle slow to check and show (20,000 unsigned entries), then at once one that verifies:
    # were the two checks to overlap, the slow one would be drawn last, over the one chosen last.
    doc = json.loads((TAMPERED_BUNDLES / "original.json").read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = [{"kind": "session_resumed", "seq": n, "ts": n, "body": {}} for n in range(20_000)]
    doc["entries"] = [{"entry": e, "hash": "0" * 64, "sig": "", "keyid": "00000000"} for e in rows]
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(doc), encoding="utf-8")
    runs = page.evaluate("window.trussReport.runs")
    page.set_file("#bundle-file", slow)
    page.set_file("#bundle-file", TAMPERED_BUNDLES / "original.json")
    page.evaluate(f"window.trussReport.after({runs + 1})", timeout=60)
    assert page.evaluate("window.trussReport.last.ok") is True
    assert text_of(page, "#overall").startswith("Verified")
    assert page.evaluate("document.querySelectorAll('#timeline tbody tr').length") == 9


# -- the network check itself --------------------------------------------------------------------------


def test_the_network_check_sees_a_request_when_a_page_makes_one(page: Page, tmp_path: Path) -> None:
    """The control for every `requests() == [...]` above: a page that fetches is seen fetching."""
    probe = tmp_path / "fetches.html"
    probe.write_text('<!doctype html><img src="http://127.0.0.1:9/pixel.png"><p>x</p>', encoding="utf-8")
    page.open(probe.resolve().as_uri())
    assert "http://127.0.0.1:9/pixel.png" in page.requests()


def test_a_bundle_chosen_in_the_page_is_read_from_disk_without_a_request(page: Page, tmp_path: Path) -> None:
    out = tmp_path / "original.html"
    original = TAMPERED_BUNDLES / "original.json"
    made = truss(tmp_path, "ledger", "report", "--bundle", str(original), "--trusted-key", log_key().verifier.vkey,
                  "-o", str(out))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert open_report(page, out)["ok"] is True
    summary = choose_bundle_file(page, TAMPERED_BUNDLES / "not_json.json")
    assert (summary["ok"], summary["step"], summary["reason"], summary["exit"]) == (False, "B1", "not_json", 2)
    assert "cannot be read" in text_of(page, "#overall")
    assert page.requests() == [out.resolve().as_uri()]


# -- what the page rebuilds and what it has no view for ----------------------------------------------


def _memory_bundle(records: list[Record]) -> tuple[bytes, str]:
    key = golden_key()
    store = MemoryStore(key=key, clock=ManualClock())
    store.append("s_page", [Record("session_started", {"contract": "page", "pins": {}, "effective": {}})])
    for record in records:
        store.append("s_page", [record])
    store.append("s_page", [Record("session_ended", {"status": "pass"})])
    return export_bundle(store, "s_page", vkey=key.verifier.vkey, signer=key), key.verifier.vkey


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for n in range(levels):
        value = {"n": n, "next": value} if n % 2 else [value]
    return value


CORNERS: dict[str, Any] = {
    "floats": [0.1, 1e21, 1e-7, 123456789.125, -0.0, 5e-324, 1.7976931348623157e308, 2.5, 100.0, -1.5e-10, 4.35e300],
    "integers": [0, -1, 2**53 - 1, -(2**53 - 1), 10**15, 2**52 + 1],
    "strings": ["naïve", "\u2028\u2029", "\x00\x01\x1f\x7f", '"\\/\b\f\n\r\t', "😀 𝄞", "e\u0301", "\ud7ff\ue000\uffff"],
    "keys": {"😀": 1, "\uffff": 2, "a": 3, "A": 4, "é": 5, "e\u0301": 6, "": 7, "\u0080": 8, "aa": 9, "a\x00": 10},
    "deep": _deep(120),
    "empty": [{}, [], "", None, True, False],
}


@pytest.mark.slow
def test_entries_holding_every_rfc_8785_corner_verify_in_the_page_as_in_python(page: Page, tmp_path: Path) -> None:
    """The page rebuilds each entry's canonical bytes from the parsed JSON; a wrong byte is a bad signature."""
    bundle, vkey = _memory_bundle([Record("model_turn", {"turn": n, "corners": value}) for n, value in enumerate(
        CORNERS.values(), start=1)])  # fmt: skip
    path = tmp_path / "corners.json"
    path.write_bytes(bundle)
    assert verify_bundle(bundle, TrustedKeys.from_texts([vkey])).ok
    out = tmp_path / "corners.html"
    out.write_text(build_report(bundle, [vkey], truss_version="test").html, encoding="utf-8")
    summary = open_report(page, out)
    assert summary["ok"] is True, summary["message"]
    assert summary["statuses"] == ["verified"] * (len(CORNERS) + 2)


@pytest.mark.slow
def test_an_entry_kind_the_page_has_no_view_for_is_shown_as_recorded_not_dropped(
    page: Page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later Truss records kinds this page has no view for: they verify and show."""
    later = frozenset({*KINDS, "future_kind", "future_decision"})
    for module in ("truss.ledger.entry", "truss.ledger.verification", "truss.report.page"):
        monkeypatch.setattr(f"{module}.KINDS", later)
    decision = {"host": "exfil.example", "port": 443, "decision": "denied", "rule": "no egress by default"}
    bundle, vkey = _memory_bundle([Record("future_decision", decision), Record("future_kind", {"what": "<b>new</b>"})])
    assert verify_bundle(bundle, TrustedKeys.from_texts([vkey])).ok
    out = tmp_path / "later.html"
    out.write_text(build_report(bundle, [vkey], truss_version="later").html, encoding="utf-8")
    assert open_report(page, out)["ok"] is True
    rows = {r["kind"]: r for r in timeline(page)}
    assert rows["future_decision"]["event"].startswith("future_decision")
    assert rows["future_decision"]["outcome"] == "denied" and rows["future_decision"]["status"] == "verified"
    assert (
        rows["future_kind"]["event"].startswith("future_kind") and '"what":"<b>new</b>"' in rows["future_kind"]["event"]
    )
    assert page.evaluate("document.querySelectorAll('#timeline b').length") == 0


@pytest.mark.slow
def test_a_sandbox_egress_entry_has_its_own_row_with_target_decision_bytes_and_duration(
    page: Page, tmp_path: Path
) -> None:
    refused = {"server": "escape", "host": "<i>evil</i>.example", "port": 443, "decision": "refused",
               "reason": "not_allowed", "method": "CONNECT", "bytes_up": 0, "bytes_down": 0,
               "duration_ms": 0}  # fmt: skip
    allowed = {**refused, "host": "127.0.0.1", "decision": "allowed", "bytes_up": 6, "bytes_down": 3, "duration_ms": 12}
    del allowed["reason"]
    flood = {"server": "escape", "host": "*", "port": 443, "decision": "refused", "attempts": 4000, "bytes_up": 0,
             "bytes_down": 0, "summary": True}  # fmt: skip
    bundle, vkey = _memory_bundle([Record("sandbox_egress", body) for body in (refused, allowed, flood)])
    out = tmp_path / "egress.html"
    out.write_text(build_report(bundle, [vkey], truss_version="test").html, encoding="utf-8")
    assert open_report(page, out)["ok"] is True
    rows = [r for r in timeline(page) if r["kind"] == "sandbox_egress"]
    assert [r["outcome"] for r in rows] == ["refused", "allowed", "refused \u00d7 4000"]
    assert all(r["status"] == "verified" and r["event"].startswith("egress decision") for r in rows)
    assert "CONNECT <i>evil</i>.example:443" in rows[0]["event"] and "reason not_allowed" in rows[0]["event"]
    assert "6 B up, 3 B down" in rows[1]["event"]
    assert "flood bound" in rows[2]["event"]
    assert page.evaluate("document.querySelectorAll('#timeline i').length") == 0
