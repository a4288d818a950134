"""How a final answer is read as claims and citations, and how a reviewer's form is judged (``truss._claims``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss._claims import (
    CALL_ID_RE,
    MAX_CLAIMS,
    Review,
    check_review,
    parse_claims,
    read_answer,
    review_schema,
    submission_of,
)


def claims_of(text: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(c.text, c.cites) for c in parse_claims(text)]


def test_a_citation_belongs_to_the_sentence_it_ends() -> None:
    assert claims_of("The branch is main [c1.0]. Two files changed [c2.0, c2.1].") == [
        ("The branch is main", ("c1.0",)),
        ("Two files changed", ("c2.0", "c2.1")),
    ]


def test_a_sentence_without_a_citation_is_a_claim_that_cites_nothing() -> None:
    assert claims_of("The repository is clean. The branch is main [c1.0].") == [
        ("The repository is clean.", ()),
        ("The branch is main", ("c1.0",)),
    ]


def test_a_citation_after_the_full_stop_still_belongs_to_its_sentence() -> None:
    assert claims_of("The branch is main. [c1.0]") == [("The branch is main.", ("c1.0",))]


def test_the_call_note_form_of_a_citation_is_read_too() -> None:
    assert claims_of("It is main [call c1.0]; it has 3 commits [calls c2.0, c3.0].") == [
        ("It is main", ("c1.0",)),
        ("it has 3 commits", ("c2.0", "c3.0")),
    ]


def test_bullets_headings_code_and_lead_ins_are_not_claims() -> None:
    text = "# Summary\nChanges:\n- README edited [c1.0]\n* 2. tests added [c2.0]\n```\nx = 1 [c9.9]\n```\n"
    assert claims_of(text) == [("README edited", ("c1.0",)), ("2. tests added", ("c2.0",))]


def test_brackets_that_are_not_call_ids_stay_text() -> None:
    assert claims_of("See note [1] and [abc] in the log [c1.0].") == [("See note [1] and [abc] in the log", ("c1.0",))]


def test_a_citation_repeated_in_one_claim_is_listed_once() -> None:
    assert claims_of("Main [c1.0] [c1.0].") == [("Main", ("c1.0",))]


@given(st.text(max_size=400))
def test_any_text_reads_as_claims_whose_citations_are_call_ids(text: str) -> None:
    for index, claim in enumerate(parse_claims(text)):
        assert claim.index == index
        assert claim.text.strip()
        assert all(CALL_ID_RE.fullmatch(c) for c in claim.cites)
        assert len(set(claim.cites)) == len(claim.cites)


@dataclass
class _Entry:
    kind: str
    body: dict[str, Any]
    seq: int = 0
    hash: str = field(default="0" * 64)


def test_an_answer_with_too_many_claims_is_a_finding() -> None:
    text = " ".join(f"Claim {i} holds [c1.0]." for i in range(MAX_CLAIMS + 1))
    reading = read_answer(text, [])
    assert [f.finding for f in reading.findings] == ["too_many_claims"]


def test_an_answer_without_claims_is_a_finding() -> None:
    assert [f.finding for f in read_answer("# Done\n", []).findings] == ["no_claims"]


def test_cited_calls_are_checked_against_what_the_session_recorded() -> None:
    entries = [
        _Entry("mcp_tool_call", {"call": "c1.0", "tool": "mcp:a:ok", "is_error": False}, 3, "a" * 64),
        _Entry(
            "mcp_tool_call",
            {"call": "c1.1", "tool": "mcp:a:bad", "is_error": False, "failure": {"cause": "timeout"}},
            4,
        ),
        _Entry("mcp_tool_denied", {"call": "c1.2", "tool": "mcp:a:no", "code": "rule", "reason": "no"}, 5),
    ]
    reading = read_answer("A [c1.0]. B [c1.1]. C [c1.2]. D [c7.0].", entries)
    assert [(f.finding, f.call) for f in reading.findings] == [
        ("failed_call", "c1.1"), ("denied_call", "c1.2"), ("unknown_call", "c7.0")
    ]  # fmt: skip
    assert reading.given == ("c1.0",)
    assert reading.cited[0].to_json()["hash"] == "a" * 64


def test_the_form_names_exactly_the_claims_and_the_calls_a_reviewer_was_given() -> None:
    schema = review_schema(2, ["c1.0"])
    items = schema["properties"]["claims"]
    assert (items["minItems"], items["maxItems"]) == (2, 2)
    assert items["items"]["properties"]["calls"]["items"]["enum"] == ["c1.0"]
    assert schema["additionalProperties"] is False


def test_a_valid_form_approves_only_when_every_claim_is_supported() -> None:
    both = {"claims": [{"claim": 1, "judgement": "supported", "calls": ["c1.0"]},
                       {"claim": 0, "judgement": "supported", "calls": ["c1.0"], "reason": "it says so"}]}  # fmt: skip
    review = check_review(both, claims=2, calls=["c1.0"])
    assert isinstance(review, Review) and review.approves
    assert [j.claim for j in review.judgements] == [0, 1]
    one_not: dict[str, Any] = {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"]},
                          {"claim": 1, "judgement": "unsupported", "calls": []}]}  # fmt: skip
    review = check_review(one_not, claims=2, calls=["c1.0"])
    assert isinstance(review, Review) and not review.approves


BAD_FORMS: list[Any] = [
    {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"]}] * 2},
    {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0", "c1.0"]}]},
    {"claims": [{"claim": True, "judgement": "supported", "calls": ["c1.0"]}]},
    {"claims": [{"claim": 0, "judgement": "supported", "calls": "c1.0"}]},
    {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"], "reason": "x" * 2001}]},
    {"claims": [{"claim": 0, "judgement": "contradicted", "calls": []}]},
    {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"]}], "summary": 3},
    [],
]


@pytest.mark.parametrize("form", BAD_FORMS)
def test_a_form_that_breaks_a_rule_is_refused_with_the_rule(form: Any) -> None:
    claims = 2 if isinstance(form, dict) and len(form.get("claims", [])) == 2 else 1  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    assert isinstance(check_review(form, claims=claims, calls=["c1.0"]), str)


def test_the_form_is_taken_from_one_submit_call_or_a_json_text() -> None:
    call: dict[str, Any] = {"id": "t", "name": "submit_review", "arguments": {"claims": []}}
    assert submission_of({"text": "", "tool_calls": [call]}) == ({"claims": []}, None)
    assert submission_of({"text": '{"claims": []}', "tool_calls": []}) == ({"claims": []}, None)
    assert submission_of({"text": "", "tool_calls": [call, call]})[1] is not None
    assert submission_of({"text": "", "tool_calls": [{**call, "name": "mcp__fs__write"}]})[1] is not None
    assert submission_of({"text": "", "tool_calls": [{**call, "arguments": None}]})[1] is not None
