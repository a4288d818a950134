"""The verdict a run folds entry by entry (``VerdictFold``, fed as the journal appends) is the one
``evaluate`` computes over the whole record, for any record and any set of done checks.

A long run keeps no record of every call for its verdict: each check remembers what its kind's fold
needs (a call, a counter, a flag). This property pins the two evaluations together: random
sequences of recorded calls (of two tools; successes, error results, failures below the tool,
results whose payload was erased or is not JSON) and denials (by policy, by budget), among entries
of every other ledger kind (``truss.ledger.entry.KINDS``), random check sets over every foldable
kind the registry holds (``truss.contract.checks.DONE_CHECKS``, built from what each kind declares
it needs) and every ``select``, a final answer or none, a run error or none. A new entry kind or a
new foldable check kind is drawn without a change here. A check set with a panel is evaluated whole
by the fold too (it keeps the entries).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from truss.contract import Contract
from truss.contract.checks import DONE_CHECKS, CheckKind, DoneCheck
from truss.ledger.entry import KINDS
from truss.verdict import RunError, VerdictFold, evaluate

TOOLS = ("mcp:srv:a", "mcp:srv:b")
BUILT = ("session_started", "model_turn", "mcp_tool_intent", "mcp_tool_call", "mcp_tool_denied")
"""The kinds ``records`` builds with their bodies; every other ledger kind is drawn as an entry beside them."""
OTHER_KINDS = sorted(KINDS - set(BUILT))
FOLDABLE = [kind for kind in DONE_CHECKS if kind.fold is not None]
REGEXES = ("n=[12]", "^n=0$", "[0-3]", "done", "^$", "n=1")


@dataclass(frozen=True)
class _Entry:
    kind: str
    body: dict[str, Any]


def _result(value: int) -> bytes:
    return json.dumps({"content": [{"type": "text", "text": f"n={value}"}], "structuredContent": {"n": value}}).encode()


@st.composite
def records(draw: st.DrawFn) -> tuple[list[_Entry], dict[str, bytes]]:
    entries: list[_Entry] = [_Entry("session_started", {"contract": "fold"})]
    blobs: dict[str, bytes] = {}
    for i in range(draw(st.integers(0, 12))):
        call, tool = f"c{i + 1}.0", draw(st.sampled_from(TOOLS))
        entries.append(_Entry("model_turn", {"turn": i + 1, "usage": {"input_tokens": 1, "output_tokens": 1}}))
        what = draw(st.sampled_from(["ok", "ok", "ok", "error", "below", "erased", "garbled", "policy", "budget"]))
        if what in ("policy", "budget"):
            body: dict[str, Any] = {"call": call, "tool": tool, "code": what, "reason": f"refused {i}"}
            if what == "budget":
                body["limit"] = "max_tool_calls"
            entries.append(_Entry("mcp_tool_denied", body))
            continue
        ref = f"sha256:{i:064x}"
        entries.append(_Entry("mcp_tool_intent", {"call": call, "tool": tool}))
        body = {"call": call, "tool": tool, "is_error": what in ("error", "below"), "result": ref}
        if what == "below":
            body["failure"] = {"cause": draw(st.sampled_from(["timeout", "server_error", "cancelled"]))}
        if what == "garbled":
            blobs[ref] = b"{not json"
        elif what != "erased":
            blobs[ref] = _result(draw(st.integers(0, 3)))
        entries.append(_Entry("mcp_tool_call", body))
        if draw(st.booleans()):
            # Another kind of entry about the same call: a check reading one must read it alike both ways.
            entries.append(_Entry(draw(st.sampled_from(OTHER_KINDS)), {"call": call, "tool": tool}))
    return entries, blobs


SELECTS = st.sampled_from([None, "last", "first", "any", "all", "call:c1.0", "call:c2.0", "call:c9.0"])


def _valid(check: dict[str, Any]) -> bool:
    try:
        DoneCheck.model_validate(check)
    except ValidationError:
        return False
    return True


@st.composite
def checks_of(draw: st.DrawFn, kind: CheckKind) -> dict[str, Any]:
    """A check of ``kind`` from what the kind declares (a tool, a select, a match), and the optional
    keys (a tool, a pointer) when the kind takes them."""
    check: dict[str, Any] = {"kind": kind.name}
    if kind.needs_tool or draw(st.booleans()):
        check["tool"] = draw(st.sampled_from(TOOLS))
    if kind.selects:
        select = draw(SELECTS)
        if select is not None:
            check["select"] = select
    if kind.needs_match:
        if draw(st.booleans()):
            check["equals"] = draw(st.integers(0, 3))
        else:
            check["regex"] = draw(st.sampled_from(REGEXES))
    pointer = draw(st.sampled_from(["", "/n", "/missing"]))
    if pointer and _valid({**check, "pointer": pointer}):
        check["pointer"] = pointer
    if not kind.needs_tool and not _valid(check):
        check.pop("tool", None)
    return check


CHECKS = st.sampled_from(FOLDABLE).flatmap(checks_of)


def test_every_foldable_check_kind_can_be_drawn_as_a_valid_check() -> None:
    # A kind needing keys checks_of does not know would be drawn as a check the contract refuses:
    # this names it, rather than the property failing on a refused contract.
    assert {k.name for k in FOLDABLE} >= {"tool_succeeded", "result_matches", "final_matches", "no_denials"}
    assert set(BUILT) <= KINDS and OTHER_KINDS

    @settings(max_examples=50, deadline=None)
    @given(st.data())
    def drawn(data: st.DataObject) -> None:
        for kind in FOLDABLE:
            check = data.draw(checks_of(kind))
            assert _valid(check), f"done-check kind {kind.name!r}: teach checks_of the keys it needs ({check})"

    drawn()


def _contract(done: dict[str, Any]) -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "fold", "intent": "check the fold"},
            "mcp": {"servers": [{"name": "srv", "command": "unused", "allow_tools": ["a", "b"]}]},
            "done": done,
        }
    )


RUN_ERRORS = st.sampled_from([None, RunError("budget", "out", "max_tool_calls"), RunError("provider", "failed")])


@settings(max_examples=300, deadline=None)
@given(
    record=records(),
    check_set=st.lists(CHECKS, max_size=4),
    pass_without=st.booleans(),
    final_text=st.sampled_from([None, "", "all done", "n=1 done"]),
    error=RUN_ERRORS,
)
def test_the_verdict_folded_entry_by_entry_is_the_verdict_of_the_whole_record(
    record: tuple[list[_Entry], dict[str, bytes]],
    check_set: list[dict[str, Any]],
    pass_without: bool,
    final_text: str | None,
    error: RunError | None,
) -> None:
    entries, blobs = record
    done: dict[str, Any] = {"checks": check_set}
    if not check_set and pass_without:
        done["pass_without_checks"] = True
    contract = _contract(done)
    whole = evaluate(contract, entries, blobs.get, final_text=final_text, error=error)
    fold = VerdictFold(contract, blobs.get)
    assert fold.folds_all
    for entry in entries:
        fold.add(entry)
    assert fold.verdict(final_text=final_text, error=error).to_json() == whole.to_json()


def test_a_panel_check_makes_the_fold_keep_the_record_and_evaluate_it_whole() -> None:
    panel = {"kind": "panel", "reviewers": [{"provider": "scripted", "name": "r1", "judge": "supported"}], "quorum": 1}
    contract = _contract({"checks": [{"kind": "tool_succeeded", "tool": "mcp:srv:a"}, panel]})
    nothing: dict[str, bytes] = {}
    fold = VerdictFold(contract, nothing.get)
    assert not fold.folds_all
    entries = [_Entry("mcp_tool_call", {"call": "c1.0", "tool": "mcp:srv:a", "is_error": False})]
    for entry in entries:
        fold.add(entry)
    folded = fold.verdict(final_text=None)
    assert folded.to_json() == evaluate(contract, entries, nothing.get, final_text=None).to_json()
    assert folded.checks[0].ok and not folded.checks[1].ok
