"""A panel of scripted reviewers, offline: whole runs in-process, observed in the verdict and the ledger."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.panel.support import (
    SESSION,
    approving,
    panel_contract,
    panel_of,
    reviews,
    run,
    scripted_reviewer,
)
from truss.ledger.verification import verify_ledger
from truss.turns import rebuild_request

pytestmark = pytest.mark.anyio

FINAL = "The VERSION file says the version is 2.1 [c1.0]."


def _outcomes(panel: dict[str, Any]) -> list[str]:
    return [r["outcome"] for r in panel["reviewers"]]


async def test_a_unanimous_panel_passes_and_every_review_is_a_signed_entry(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported") * 3
    outcome, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=3))
    assert outcome.status == "pass"
    panel = panel_of(outcome)
    assert panel["outcome"] == "approved"
    assert panel["approvals"] == 3
    assert _outcomes(panel) == ["approve"] * 3
    assert panel["claims"] == [{"claim": 0, "text": "The VERSION file says the version is 2.1", "cites": ["c1.0"]}]
    recorded = reviews(store)
    assert [(e.body["check"], e.body["reviewer"], e.body["name"]) for e in recorded] == [
        (0, 0, "r0"), (0, 1, "r1"), (0, 2, "r2")
    ]  # fmt: skip
    assert verify_ledger(store, trusted=store_key(store)).ok


def store_key(store: Any) -> Any:
    from tests.gate.support import SEED
    from truss.ledger.keys import IdentityKey, TrustedKeys

    trusted = TrustedKeys()
    trusted.add(IdentityKey.from_seed(SEED, "truss.test/gate").verifier)
    return trusted


async def test_two_approvals_pass_a_two_of_three_quorum_and_the_rejection_is_listed(tmp_path: Path) -> None:
    no = {"claims": [{"claim": 0, "judgement": "contradicted", "calls": ["c1.0"], "reason": "it says 2.1"}]}
    reviewers = (
        scripted_reviewer(judge="supported")
        + scripted_reviewer(answer=no)
        + scripted_reviewer(answer=approving(1, ["c1.0"]))
    )
    outcome, _ = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=2))
    assert outcome.status == "pass"
    panel = panel_of(outcome)
    assert _outcomes(panel) == ["approve", "reject", "approve"]
    assert panel["reviewers"][1]["judgements"] == [{"claim": 0, "judgement": "contradicted", "calls": ["c1.0"]}]
    assert panel["reviewers"][1]["reason"] == "claim 0 contradicted"


async def test_one_approval_fails_a_two_of_three_quorum_because_the_reviewers_said_no(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported") + scripted_reviewer(judge="unsupported") * 2
    outcome, _ = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=2))
    assert outcome.status == "fail"
    assert outcome.exit_code == 1
    panel = panel_of(outcome)
    assert panel["outcome"] == "rejected"
    assert _outcomes(panel) == ["approve", "reject", "reject"]


async def test_a_reviewer_relying_on_a_call_the_session_does_not_have_does_not_approve(tmp_path: Path) -> None:
    invented = {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c9.9"]}]}
    reviewers = scripted_reviewer(judge="supported") * 2 + scripted_reviewer(answer=invented)
    outcome, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=3))
    assert outcome.status == "error"  # the malformed answer is the difference: the panel could not decide
    panel = panel_of(outcome)
    third = panel["reviewers"][2]
    assert (third["outcome"], third["cause"]) == ("failed", "malformed")
    assert "c9.9" in third["reason"]
    assert reviews(store)[2].body["outcome"] == "failed"
    assert outcome.verdict is not None
    assert outcome.verdict["error"]["cause"] == "panel"


async def test_an_answer_citing_a_call_the_session_does_not_have_is_a_finding_and_no_one_is_asked(
    tmp_path: Path,
) -> None:
    final = "The version is 2.1 [c1.0]. The tests pass [c4.2]."
    reviewers = scripted_reviewer(judge="supported") * 3
    outcome, store = await run(tmp_path, panel_contract(final=final, reviewers=reviewers, quorum=1))
    assert outcome.status == "fail"
    panel = panel_of(outcome)
    assert panel["outcome"] == "findings"
    assert panel["findings"] == [
        {"finding": "unknown_call", "claim": 1, "call": "c4.2",
         "detail": "claim 1 cites c4.2, which the session does not have"}
    ]  # fmt: skip
    assert reviews(store) == []


async def test_an_answer_citing_a_denied_call_is_a_finding(tmp_path: Path) -> None:
    final = "The version is 2.1 [c1.0]. The new version was written [c2.0]."
    steps = (("read", {"path": "VERSION"}), ("write", {"path": "VERSION", "text": "2.2"}))
    reviewers = scripted_reviewer(judge="supported")
    outcome, store = await run(tmp_path, panel_contract(final=final, reviewers=reviewers, quorum=1, steps=steps))
    assert outcome.status == "fail"
    panel = panel_of(outcome)
    [finding] = panel["findings"]
    assert (finding["finding"], finding["claim"], finding["call"]) == ("denied_call", 1, "c2.0")
    denied = next(e for e in store.read_session(SESSION) if e.kind == "mcp_tool_denied")
    assert {"call": "c2.0", "tool": "mcp:srv:write", "status": "denied", "kind": "mcp_tool_denied",
            "seq": denied.seq, "hash": denied.hash} in panel["cited"]  # fmt: skip
    assert reviews(store) == []


async def test_an_answer_citing_a_call_that_returned_an_error_is_a_finding(tmp_path: Path) -> None:
    final = "The check ran clean [c1.0]."
    steps: tuple[tuple[str, dict[str, Any]], ...] = (("broken", {}),)
    reviewers = scripted_reviewer(judge="supported")
    outcome, _ = await run(tmp_path, panel_contract(final=final, reviewers=reviewers, quorum=1, steps=steps))
    assert outcome.status == "fail"
    [finding] = panel_of(outcome)["findings"]
    assert finding["finding"] == "failed_call"


async def test_a_reviewer_that_never_answers_times_out_and_does_not_approve(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported") * 2 + scripted_reviewer(stall=True, name="slow")
    text = panel_contract(final=FINAL, reviewers=reviewers, quorum=2, panel='deadline = "300ms"')
    outcome, store = await run(tmp_path, text)
    assert outcome.status == "pass"  # two of three approved; the third's silence does not matter
    slow = panel_of(outcome)["reviewers"][2]
    assert (slow["name"], slow["outcome"], slow["cause"]) == ("slow", "failed", "timeout")
    entry = reviews(store)[-1]
    assert entry.body["failure"]["cause"] == "timeout"
    assert "response" not in entry.body


async def test_a_panel_whose_timed_out_reviewer_could_have_made_the_quorum_ends_in_error(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported") + scripted_reviewer(stall=True)
    text = panel_contract(final=FINAL, reviewers=reviewers, quorum=2, panel='deadline = "300ms"')
    outcome, _ = await run(tmp_path, text)
    assert (outcome.status, outcome.exit_code) == ("error", 4)
    assert panel_of(outcome)["outcome"] == "undecided"


MALFORMED: list[tuple[Any, str]] = [
    ("looks fine to me", "not JSON"),
    ({"claims": []}, "judges 0 claim(s)"),
    ({"claims": [{"claim": 0, "judgement": "plausible", "calls": ["c1.0"]}]}, "judgement"),
    ({"claims": [{"claim": 0, "judgement": "supported", "calls": []}]}, "names no call"),
    ({"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"], "score": 9}]}, "members"),
    ({"claims": [{"claim": 1, "judgement": "supported", "calls": ["c1.0"]}]}, "claim number"),
    ({"verdict": "approve"}, "members"),
]


@pytest.mark.parametrize(("answer", "why"), MALFORMED)
async def test_a_malformed_answer_counts_as_not_approving_with_its_reason(
    tmp_path: Path, answer: Any, why: str
) -> None:
    reviewers = scripted_reviewer(answer=answer)
    outcome, _ = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=1))
    assert outcome.status == "error"
    [reviewer] = panel_of(outcome)["reviewers"]
    assert (reviewer["outcome"], reviewer["cause"]) == ("failed", "malformed")
    assert why in reviewer["reason"]


async def test_the_verdict_envelope_attests_the_panel_outcome_and_the_cited_entries(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported")
    outcome, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=1))
    envelope = store.envelope(SESSION)
    assert envelope is not None
    statement = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    [check] = statement["predicate"]["checks"]
    call = next(e for e in store.read_session(SESSION) if e.kind == "mcp_tool_call")
    assert check["panel"]["outcome"] == "approved"
    assert check["panel"]["cited"] == [
        {"call": "c1.0", "tool": "mcp:srv:read", "status": "ok", "kind": "mcp_tool_call", "seq": call.seq,
         "hash": call.hash}
    ]  # fmt: skip
    review = reviews(store)[0]
    assert check["panel"]["reviewers"][0]["hash"] == review.hash
    assert outcome.head == statement["subject"][0]["digest"]["sha256"]


async def test_the_model_is_asked_to_cite_and_each_result_note_names_its_call(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported")
    _, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=1))
    turns = [e for e in store.read_session(SESSION) if e.kind == "model_turn"]
    request = rebuild_request(turns[-1].body["request"], store.blob)
    assert request is not None
    assert "[c1.0]" in request["system"]
    tool_message = next(m for m in request["messages"] if m["role"] == "tool")
    assert tool_message["note"].startswith("[call c1.0] [budget left:")


async def test_each_reviewer_is_given_the_cited_calls_recorded_arguments_and_results(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported")
    _, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=1))
    [review] = reviews(store)
    request = json.loads(store.blob(review.body["request"]) or b"")
    assert request["subject"] == review.body["subject"]
    assert request["tool_choice"] == "submit_review"
    assert request["tools"][0]["input_schema"]["properties"]["claims"]["minItems"] == 1
    subject = json.loads(store.blob(review.body["subject"]) or b"")
    assert subject["intent"] == "Find the version in the VERSION file."
    assert subject["answer"] == FINAL
    [call] = subject["calls"]
    assert call["arguments"] == {"path": "VERSION"}
    assert call["result"]["content"][0]["text"] == "the file VERSION says: version 2.1"


async def test_a_run_without_a_final_answer_asks_no_reviewer(tmp_path: Path) -> None:
    reviewers = scripted_reviewer(judge="supported")
    text = panel_contract(final=FINAL, reviewers=reviewers, quorum=1, budget="max_model_turns = 1")
    outcome, store = await run(tmp_path, text)
    assert outcome.status == "error"
    assert panel_of(outcome)["outcome"] == "no_answer"
    assert reviews(store) == []


async def test_each_review_is_an_event_and_a_progress_line(tmp_path: Path) -> None:
    from tests.gate.support import contract_from, fake_connector, new_store, scripted
    from tests.panel.support import transport
    from truss.events import Event, PanelReviewed, ProgressEvent, progress_subscriber
    from truss.runtime import Runtime
    from truss.session import run_contract
    from truss.testing import ManualClock

    seen: list[Event] = []
    progress: list[ProgressEvent] = []
    store, key = new_store(tmp_path)
    reviewers = scripted_reviewer(judge="supported", name="ann") + scripted_reviewer(judge="unsupported")
    runtime = Runtime(store=store, key=key, clock=ManualClock(), home=tmp_path, environ={},
                      connector=fake_connector(transport()), provider=scripted(),
                      events=[seen.append, progress_subscriber(progress.append)])  # fmt: skip
    await run_contract(runtime, contract_from(panel_contract(final=FINAL, reviewers=reviewers, quorum=1)),
                       session_id=SESSION)  # fmt: skip
    reviewed = sorted((e.reviewer, e.outcome, e.replayed) for e in seen if isinstance(e, PanelReviewed))
    assert reviewed == [("ann", "approve", False), ("r1", "reject", False)]
    assert sorted((p.tool, p.outcome) for p in progress if p.kind == "review") == [("ann", "approve"), ("r1", "reject")]
    by_seq = {e.seq: e for e in reviews(store)}
    assert all(by_seq[e.seq].body["name"] == e.reviewer for e in seen if isinstance(e, PanelReviewed))


def test_a_panel_with_every_reviewer_key_round_trips_through_its_recorded_json_form() -> None:
    from tests.gate.support import contract_from
    from truss.contract import Contract

    reviewers = """
[[done.checks.reviewers]]
name = "full"
provider = "openai"
model = "m"
base_url = "https://models.example.com/v1"
api_key_env = "MODEL_KEY"
max_output_tokens = 512
temperature = 0.2
request_timeout = "30s"
max_attempts = 2
[[done.checks.reviewers]]
provider = "scripted"
stall = true
[[done.checks.reviewers]]
provider = "scripted"
answer = "plain text"
"""
    panel = 'rubric = "strict"\nmax_tokens = 1000\ndeadline = "1m"'
    contract = contract_from(panel_contract(final=FINAL, reviewers=reviewers, quorum=2, panel=panel))
    again = Contract.model_validate(contract.to_json())
    assert again.hash == contract.hash
    assert again.done.checks[0].reviewers == contract.done.checks[0].reviewers
