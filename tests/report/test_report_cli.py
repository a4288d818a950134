"""``truss ledger report`` and ``truss ledger why`` as a user runs them: subprocesses over real sessions."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.ledger.test_bundle import TAMPERED as TAMPERED_BUNDLES
from tests.ledger.test_bundle import log_key, stranger_key
from tests.report.support import truss


def _embedded(page: Path) -> tuple[bytes, dict[str, Any]]:
    text = page.read_text(encoding="utf-8")
    bundle = re.search(r'<script type="application/octet-stream" id="truss-bundle">([^<]*)</script>', text)
    config = re.search(r'<script type="application/json" id="truss-config">([^<]*)</script>', text)
    assert bundle is not None and config is not None
    return base64.b64decode("".join(bundle.group(1).split())), json.loads(config.group(1))


def _seq_of(home: Path, session: str, kind: str, call: str) -> int:
    shown = json.loads(truss(home, "ledger", "show", session, "--json").stdout)
    [seq] = [e["seq"] for e in shown["entries"] if e["kind"] == kind and e["entry"]["body"].get("call") == call]
    return int(seq)


def _why(home: Path, session: str, call: str) -> dict[str, dict[str, Any]]:
    done = truss(home, "ledger", "why", session, call, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["session"] == session and doc["call"] == call
    return {step["step"]: step for step in doc["steps"]}


# -- report ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_of_a_session_is_one_html_file_carrying_the_bundle_export_would_write(
    sessions: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    done = truss(sessions, "ledger", "report", "approval", "-o", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] is True and summary["session"] == "approval" and summary["bytes"] == out.stat().st_size
    bundle, config = _embedded(out)
    exported = tmp_path / "exported.json"
    assert truss(sessions, "ledger", "export", "approval", "-o", str(exported)).returncode == 0
    assert bundle + b"\n" == exported.read_bytes()  # the same bundle, without the file's final newline
    home_key = truss(sessions, "key", "show").stdout.strip().splitlines()[-1]
    assert config["trusted"] == [home_key]
    assert set(config["derived"]["calls"]) == {"c1.0", "c2.0"}
    (tmp_path / "embedded.json").write_bytes(bundle)
    check = truss(sessions, "ledger", "verify", "--bundle", str(tmp_path / "embedded.json"))
    assert check.returncode == 0, check.stdout


@pytest.mark.slow
def test_report_embeds_the_keys_it_is_told_to_trust_and_says_when_they_do_not_verify(
    sessions: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    done = truss(sessions, "ledger", "report", "pass", "-o", str(out), "--trusted-key", stranger_key().verifier.vkey)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does NOT verify (B3 no_trusted_signature)" in done.stdout and "The page shows where" in done.stdout
    assert _embedded(out)[1]["trusted"] == [stranger_key().verifier.vkey]


def test_report_of_a_tampered_bundle_is_written_and_exits_1_naming_the_entry(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    bundle = TAMPERED_BUNDLES / "entries_reordered.json"
    done = truss(tmp_path, "ledger", "report", "--bundle", str(bundle), "--trusted-key", log_key().verifier.vkey,
                 "-o", str(out))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does NOT verify at seq 4 (B4 reordered)" in done.stdout
    assert _embedded(out)[0] == bundle.read_bytes()


@pytest.mark.parametrize("name", ["not_json", "wrong_format_tag", "entry_missing_its_signature"])
def test_report_of_a_bundle_that_cannot_be_read_exits_2_and_leaves_the_output_alone(name: str, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    out.write_text("an earlier report", encoding="utf-8")
    done = truss(tmp_path, "ledger", "report", "--bundle", str(TAMPERED_BUNDLES / f"{name}.json"),
                 "--trusted-key", log_key().verifier.vkey, "-o", str(out))  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot be read" in done.stderr and "no report was written" in done.stderr
    assert out.read_text(encoding="utf-8") == "an earlier report"
    assert not (tmp_path / "report.html.tmp").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["ledger", "report", "-o", "x.html"],
        ["ledger", "report", "s1", "--bundle", "b.json", "-o", "x.html"],
        ["ledger", "report", "s1"],
        ["ledger", "report", "--bundle", "b.json", "--no-payloads", "-o", "x.html"],
        ["ledger", "report", "--bundle", "missing.json", "-o", "x.html"],
    ],
    ids=["neither", "both", "no-output", "no-payloads-with-bundle", "missing-file"],
)
def test_report_with_unusable_arguments_exits_2_with_one_paragraph(args: list[str], tmp_path: Path) -> None:
    done = truss(tmp_path, *args, "--trusted-key", log_key().verifier.vkey)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("truss") and done.stderr.count("\n") <= 2
    assert not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_report_of_an_unknown_session_exits_2(sessions: Path, tmp_path: Path) -> None:
    done = truss(sessions, "ledger", "report", "no-such-session", "-o", str(tmp_path / "x.html"))
    assert done.returncode == 2 and "no-such-session" in done.stderr
    assert not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_report_without_payloads_leaves_the_arguments_and_results_out(sessions: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = truss(sessions, "ledger", "report", "pass", "--no-payloads", "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    bundle, config = _embedded(out)
    assert json.loads(bundle)["blobs"] == {}
    policy = next(s for s in config["derived"]["calls"]["c1.0"]["steps"] if s["step"] == "policy")
    assert "not held" in policy["text"]


# -- why ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_why_names_the_rule_that_denied_a_call_and_the_entry_that_records_it(sessions: Path) -> None:
    steps = _why(sessions, "denied", "c2.0")
    denied_at = _seq_of(sessions, "denied", "mcp_tool_denied", "c2.0")
    assert steps["policy"]["decision"] == "denied" and steps["policy"]["seqs"] == [denied_at]
    assert "rule 0 (mcp:tools:has_env -> deny" in steps["policy"]["text"]
    assert "no probing of the environment" in steps["policy"]["text"] and steps["policy"]["derived"] is False
    assert steps["budget"]["decision"] == "not charged" and steps["execution"]["decision"] == "not called"
    assert steps["allowlist"]["decision"] == "allowed" and steps["allowlist"]["seqs"] == [0]
    human = truss(sessions, "ledger", "why", "denied", "c2.0")
    assert human.returncode == 0 and human.stdout.startswith("call c2.0 of session denied: mcp:tools:has_env, denied")
    assert f"[seq {denied_at}]" in human.stdout


@pytest.mark.slow
def test_why_of_an_allowed_call_re_derives_the_rule_and_counts_the_budget_and_says_so(sessions: Path) -> None:
    steps = _why(sessions, "pass", "c1.0")
    intent = _seq_of(sessions, "pass", "mcp_tool_intent", "c1.0")
    assert steps["policy"]["decision"] == "allowed" and steps["policy"]["derived"] is True
    assert "allowed by the default (policy.default = allow)" in steps["policy"]["text"]
    assert steps["budget"]["decision"] == "charged" and steps["budget"]["seqs"] == [intent]
    assert "call 1 of max_tool_calls 100" in steps["budget"]["text"]
    assert steps["pin"]["decision"] == "matched" and steps["execution"]["decision"] == "live"
    assert steps["outcome"]["decision"] == "ok"


@pytest.mark.slow
def test_why_of_an_approved_call_names_the_request_the_decision_and_the_resumed_leg(sessions: Path) -> None:
    steps = _why(sessions, "approval", "c2.0")
    asked = _seq_of(sessions, "approval", "approval_requested", "c2.0")
    decided = _seq_of(sessions, "approval", "approval_decided", "c2.0")
    assert steps["policy"]["decision"] == "ask" and "writes need a person" in steps["policy"]["text"]
    assert steps["approval"]["decision"] == "approved" and steps["approval"]["seqs"] == [asked, decided]
    assert "checked by hand" in steps["approval"]["text"]
    assert "in leg 2 of the run" in steps["execution"]["text"]
    # The first call ran before the suspension; on resume its recorded result was replayed, not re-sent.
    first = _why(sessions, "approval", "c1.0")
    assert "the recorded result was returned from the ledger" in first["execution"]["text"]


@pytest.mark.slow
def test_why_of_a_call_still_waiting_for_approval_says_what_to_run(sessions: Path) -> None:
    steps = _why(sessions, "waiting", "c2.0")
    assert steps["approval"]["decision"] == "waiting" and "truss approve waiting c2.0" in steps["approval"]["text"]
    assert steps["budget"]["decision"] == "not charged" and steps["outcome"]["text"] == "waiting for approval"


@pytest.mark.slow
def test_why_of_a_memo_hit_names_the_session_and_entry_it_came_from(sessions: Path) -> None:
    steps = _why(sessions, "memo-b", "c1.0")
    original = _seq_of(sessions, "memo-a", "mcp_tool_call", "c1.0")
    assert steps["execution"]["decision"] == "memo"
    assert f"session memo-a recorded at seq {original}" in steps["execution"]["text"]
    assert "memo = '1h'" in steps["execution"]["text"] and "the server was not called" in steps["execution"]["text"]


@pytest.mark.slow
def test_why_of_a_call_resolved_after_a_crash_and_of_a_signalled_one(sessions: Path) -> None:
    doubt = _why(sessions, "doubt", "c1.0")
    assert doubt["execution"]["decision"] == "resolved" and "--result" in doubt["execution"]["text"]
    resolved = _seq_of(sessions, "doubt", "in_doubt_resolved", "c1.0")
    assert resolved in doubt["execution"]["seqs"]
    signal = _why(sessions, "signal", "c1.0")
    assert signal["execution"]["decision"] == "async" and "'job-web'" in signal["execution"]["text"]
    assert _seq_of(sessions, "signal", "signal_received", "c1.0") in signal["execution"]["seqs"]


@pytest.mark.slow
def test_why_of_an_unknown_call_or_session_exits_2_and_lists_what_there_is(sessions: Path) -> None:
    call = truss(sessions, "ledger", "why", "approval", "c9.9")
    assert call.returncode == 2 and "c1.0, c2.0" in call.stderr
    session = truss(sessions, "ledger", "why", "nope", "c1.0")
    assert session.returncode == 2 and "nope" in session.stderr
