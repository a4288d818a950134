"""The ``panel`` done-check kind: N reviewers judge the final answer's claims against the calls they cite.

The keys (checked at load): ``reviewers`` (1 to ``MAX_REVIEWERS`` ``[[done.checks.reviewers]]``,
``truss.contract.reviewers``; names unique, ``r<i>`` by default), ``quorum`` (how many must approve,
1 to N), ``rubric`` (text the reviewers judge by; a default when absent), and the optional limits
``max_tokens`` (all reviewers of this panel together) and ``deadline`` (the whole panel); both
count against the run's own budget too. A panel takes no ``tool``, ``pointer``, ``regex`` or
``equals``.

The reviewers are asked by ``truss.panel`` when the run has its final answer, before the verdict,
and each answer (or failure) is a signed ``panel_review`` entry. This module only *reads* them:
``evaluate`` is pure, so a replayed session reaches the same verdict with no model reachable. It
reads the final answer from the recorded last model turn, its claims and citations
(``truss._claims``), and each reviewer's entry, and decides:

- Truss's own findings (a cited call the session does not have, a denied or failed cited call, no
  claims, too many) fail the check; no reviewer was asked;
- otherwise each reviewer *approves* (a valid answer, every claim ``supported``), *rejects* (a
  valid answer with a claim ``unsupported`` or ``contradicted``) or *failed* (no valid answer:
  malformed, timeout, provider error, budget, never recorded); failing counts as not approving;
- the check passes when at least ``quorum`` approve. When it does not, and the reviewers who
  failed could have made the quorum, the panel could not decide: the check fails with cause
  ``panel`` and the verdict is ``error`` (exit 4). When even they could not, the reviewers said no:
  the verdict is ``fail`` (exit 1).

The check's verdict entry carries ``panel``: outcome, quorum, approvals, the claims with their
citations, the findings, the cited entries (call, seq, entry hash) and each reviewer's outcome
with its judgements (docs/panel.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from truss._claims import MAX_CLAIMS, Reading, final_answer, judge_response, read_answer
from truss.contract.checks import DONE_CHECKS, KIND_KEYS, Checked, CheckKind, DoneCheck, Evidence
from truss.contract.reviewers import Reviewer

__all__ = [
    "DEFAULT_RUBRIC",
    "MAX_REVIEWERS",
    "PANEL",
    "PANEL_KIND",
    "evaluate_panel",
    "panel_checks",
    "reviewer_name",
    "uses_panel",
]

PANEL_KIND = "panel"
MAX_REVIEWERS = 9
DEFAULT_RUBRIC = (
    "A claim is supported only when a cited result states it or it follows directly from one; a claim "
    "that goes beyond what the results show is unsupported, and one they refute is contradicted."
)
_CLAIM_CHARS = 200  # of each claim's text in the verdict (the whole answer stays in the ledger)
_REASON_CHARS = 300


def reviewer_name(index: int, reviewer: Reviewer) -> str:
    return reviewer.name or f"r{index}"


def panel_checks(checks: Sequence[DoneCheck]) -> list[tuple[int, DoneCheck]]:
    """The panel checks of ``[[done.checks]]``, with their positions."""
    return [(i, c) for i, c in enumerate(checks) if c.kind == PANEL_KIND]


def uses_panel(checks: Sequence[DoneCheck]) -> bool:
    """True when a check is a panel: the loop then asks the model to cite call ids."""
    return any(c.kind == PANEL_KIND for c in checks)


def _validate(check: DoneCheck) -> str | None:
    for key in ("tool", "regex", "equals"):
        if key in check.model_fields_set:
            return f"a panel check takes no {key}: it judges the final answer's claims"
    if check.pointer:
        return "a panel check takes no pointer"
    reviewers = check.reviewers or []
    if not reviewers:
        return "a panel check needs reviewers ([[done.checks.reviewers]])"
    if len(reviewers) > MAX_REVIEWERS:
        return f"a panel has at most {MAX_REVIEWERS} reviewers, this one {len(reviewers)}"
    names = [reviewer_name(i, r) for i, r in enumerate(reviewers)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"reviewer name {twice[0]!r} is used twice (unnamed reviewers are r0, r1, ...)"
    if check.quorum is None:
        return "a panel check needs a quorum (how many reviewers must approve)"
    if not 1 <= check.quorum <= len(reviewers):
        return f"quorum {check.quorum} must be from 1 to the number of reviewers ({len(reviewers)})"
    return None


# -- evaluation (pure: reads the record) -------------------------------------------------------------


def evaluate_panel(check: DoneCheck, evidence: Evidence) -> Checked:
    """The panel's outcome from the recorded answer and ``panel_review`` entries (module docstring)."""
    reviewers = check.reviewers or []
    quorum = check.quorum or len(reviewers)
    answer, why = final_answer(evidence.entries, evidence.blob)
    panel: dict[str, Any] = {"quorum": quorum, "approvals": 0}
    if answer is None:
        panel["outcome"] = "no_answer"
        return Checked(False, f"nothing to review: {why}", {"panel": panel})
    reading = read_answer(answer, evidence.entries)
    panel["claims"] = [c.to_json(max_chars=_CLAIM_CHARS) for c in reading.claims[:MAX_CLAIMS]]
    panel["findings"] = [f.to_json() for f in reading.findings]
    panel["cited"] = [c.to_json() for c in reading.cited]
    if reading.findings:
        panel["outcome"] = "findings"
        first = reading.findings[0]
        more = f" (and {len(reading.findings) - 1} more finding(s))" if len(reading.findings) > 1 else ""
        return Checked(False, f"no reviewer asked: {first.detail}{more}", {"panel": panel})
    recorded = _reviews_of(evidence.entries, evidence.check_index)
    outcomes = [_outcome(i, r, recorded.get(i), reading, evidence) for i, r in enumerate(reviewers)]
    panel["reviewers"] = outcomes
    approvals = sum(1 for o in outcomes if o["outcome"] == "approve")
    failed = [o for o in outcomes if o["outcome"] == "failed"]
    rejected = [o for o in outcomes if o["outcome"] == "reject"]
    panel["approvals"] = approvals
    tally = f"{approvals} of {len(reviewers)} reviewers approved (quorum {quorum})"
    if approvals >= quorum:
        panel["outcome"] = "approved"
        return Checked(True, tally, {"panel": panel})
    if approvals + len(failed) >= quorum:
        panel["outcome"] = "undecided"
        said = "; ".join(f"{o['name']} {o.get('cause', 'failed')}: {o['reason']}" for o in failed)
        return Checked(False, f"{tally}; could not answer: {said}", {"panel": panel}, cause="panel")
    panel["outcome"] = "rejected"
    said = "; ".join(f"{o['name']}: {o['reason']}" for o in rejected)
    return Checked(False, f"{tally}; rejected by {said}" if said else tally, {"panel": panel})


def _reviews_of(entries: Sequence[Any], check: int) -> dict[int, Any]:
    found: dict[int, Any] = {}
    for entry in entries:
        if entry.kind != "panel_review":
            continue
        body: Mapping[str, Any] = entry.body
        reviewer = body.get("reviewer")
        if body.get("check") == check and isinstance(reviewer, int) and not isinstance(reviewer, bool):
            found.setdefault(reviewer, entry)  # the first answer counts; a resumed run never asks again
    return found


def _outcome(index: int, reviewer: Reviewer, entry: Any, reading: Reading, evidence: Evidence) -> dict[str, Any]:
    out: dict[str, Any] = {"reviewer": index, "name": reviewer_name(index, reviewer), "provider": reviewer.provider}
    if reviewer.model:
        out["model"] = reviewer.model
    if entry is None:
        return {**out, "outcome": "failed", "cause": "not_asked", "reason": "no review was recorded"}
    out["seq"], out["hash"] = getattr(entry, "seq", None), getattr(entry, "hash", None)
    body: Mapping[str, Any] = entry.body
    raw: Any = body.get("failure")
    failure: dict[str, Any] | None = cast(dict[str, Any], raw) if isinstance(raw, dict) else None
    ref = body.get("response")
    if failure is not None and (failure.get("cause") != "budget" or not isinstance(ref, str)):
        return {**out, "outcome": "failed", "cause": str(failure.get("cause")), "reason": _short(failure.get("detail"))}
    data = evidence.blob(ref) if isinstance(ref, str) else None
    if data is None:
        return {**out, "outcome": "failed", "cause": "erased", "reason": "the reviewer's answer is not stored"}
    try:
        response: Any = json.loads(data)
    except ValueError:
        response = None
    review, reason = judge_response(response, claims=len(reading.claims), calls=reading.given)
    if review is not None:
        out["judgements"] = [j.to_json() for j in review.judgements]
    if failure is not None:  # over a token limit: the answer is kept but does not count
        return {**out, "outcome": "failed", "cause": "budget", "reason": _short(failure.get("detail"))}
    if review is None:
        return {**out, "outcome": "failed", "cause": "malformed", "reason": _short(reason)}
    return {**out, "outcome": "approve" if review.approves else "reject", "reason": _short(reason)}


def _short(text: Any) -> str:
    value = str(text) if text is not None else ""
    return value if len(value) <= _REASON_CHARS else value[:_REASON_CHARS] + "..."


PANEL = CheckKind(
    PANEL_KIND,
    evaluate_panel,
    validate=_validate,
    summary="a quorum of reviewers finds the final answer's claims supported by the calls they cite",
    keys=KIND_KEYS,
)
DONE_CHECKS.register(PANEL)
