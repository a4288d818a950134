"""Claims, citations and the reviewer's form: what a reviewer panel reads, and what it accepts back.

A run's final answer is read as a list of **claims**, each tied to the calls it cites
(docs/panel.md). A citation is a bracketed list of Truss call ids after the claim, e.g.
``The branch is main [c1.0].`` or ``... [c1.0, c2.1]`` (``[call c1.0]`` is read too: it is the form
the tool notes show the model). The answer is split into lines; bullets and numbering are dropped;
headings (``#``), fenced code, blank lines and lead-ins ending in ``:`` are not claims; a line is
split into sentences (at ``.``, ``!`` or ``?`` followed by a space and a capital letter or digit);
a citation belongs to the sentence it ends, and a citation with no sentence before it in its line
(``It is main. [c1.0]``) to the sentence before it. Every other sentence with a letter or digit in
it is a claim without citations.

What the answer cites is checked against the session's record (``read_answer``): a cited id that
the session does not have, or that names a denied call or a call whose result was an error or a
failure, is a **finding**; so are an answer without claims, one with more than ``MAX_CLAIMS`` of
them and one longer than ``MAX_ANSWER_CHARS``. Findings decide the panel without any reviewer.

A reviewer answers in one fixed **form** (``review_schema``), submitted as the arguments of the
tool ``submit_review``: one judgement per claim (``supported`` / ``unsupported`` /
``contradicted``) with the call ids it relied on. ``check_review`` validates an answer strictly; a
reviewer approves when its answer is valid and every claim is ``supported``.

Pure: entries are read through ``kind``, ``body``, ``seq`` and ``hash``, payloads through the
``blob`` function given. Nothing here knows a provider, a store or a clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

__all__ = [
    "CALL_ID_RE",
    "JUDGEMENTS",
    "MAX_ANSWER_CHARS",
    "MAX_CLAIMS",
    "SUBMIT_TOOL",
    "CallFact",
    "Claim",
    "Finding",
    "Judgement",
    "Reading",
    "Review",
    "call_facts",
    "check_review",
    "final_answer",
    "judge_response",
    "parse_claims",
    "read_answer",
    "review_schema",
    "submission_of",
]

SUBMIT_TOOL = "submit_review"
JUDGEMENTS = ("supported", "unsupported", "contradicted")
MAX_ANSWER_CHARS = 100_000
MAX_CLAIMS = 100
MAX_REASON_CHARS = 2000
MAX_SUMMARY_CHARS = 4000

_ID = r"c[0-9]{1,9}\.[0-9]{1,6}"
CALL_ID_RE = re.compile(_ID)
_CITATION_RE = re.compile(r"\[\s*(?:calls?\s+)?(" + _ID + r"(?:\s*[,;]\s*" + _ID + r")*)\s*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[*_]?[A-Z0-9])")
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d{1,3}[.)])\s+")
_LEADING = re.compile(r"^[\s,;:.)\]\-\u2013\u2014]+")
_WORD = re.compile(r"\w")

Blob = Callable[[str], bytes | None]
Status = Literal["ok", "error", "failed", "denied"]


# -- claims ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """One claim of the final answer: its number (from 0), its text, the call ids it cites (in order, once each)."""

    index: int
    text: str
    cites: tuple[str, ...]

    def to_json(self, *, max_chars: int | None = None) -> dict[str, Any]:
        text = self.text if max_chars is None or len(self.text) <= max_chars else self.text[:max_chars] + "..."
        return {"claim": self.index, "text": text, "cites": list(self.cites)}


def _sentences(fragment: str) -> list[str]:
    text = _LEADING.sub("", fragment).rstrip()
    out: list[str] = []
    for part in _SENTENCE_END.split(text):
        sentence = part.strip()
        if _WORD.search(sentence) and not sentence.endswith(":"):
            out.append(sentence)
    return out


def parse_claims(answer: str) -> list[Claim]:
    """The claims of ``answer`` with their citations (the rules are in the module docstring)."""
    found: list[tuple[str, list[str]]] = []
    fenced = False
    for raw in answer.splitlines():
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or not line or line.startswith("#"):
            continue
        line = _BULLET.sub("", line)
        first_of_line = len(found)
        pending: list[str] = []  # citations before any sentence of the line: they go to its first one
        pos = 0
        for match in _CITATION_RE.finditer(line):
            ids = CALL_ID_RE.findall(match.group(1))
            sentences = _sentences(line[pos : match.start()])
            if sentences:
                found.extend((s, []) for s in sentences)
                found[-1][1].extend(ids)
                if pending:
                    found[first_of_line][1][:0] = pending
                    pending = []
            elif len(found) > first_of_line:
                found[-1][1].extend(ids)
            else:
                pending.extend(ids)
            pos = match.end()
        tail = _sentences(line[pos:])
        found.extend((s, []) for s in tail)
        if pending and len(found) > first_of_line:
            found[first_of_line][1][:0] = pending
    return [Claim(i, text, tuple(dict.fromkeys(cites))) for i, (text, cites) in enumerate(found)]


# -- the session's calls, as citations see them ------------------------------------------------------


@dataclass(frozen=True)
class CallFact:
    """What the record says about one call id: how it ended and the entry that says so."""

    call: str
    tool: str
    status: Status
    kind: str  # mcp_tool_call or mcp_tool_denied
    seq: int | None
    hash: str | None
    detail: str
    args: str | None  # payload refs
    result: str | None

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call, "tool": self.tool, "status": self.status, "kind": self.kind, "seq": self.seq,
                "hash": self.hash}  # fmt: skip


def call_facts(entries: Iterable[Any]) -> dict[str, CallFact]:
    """Call id -> how it ended, from the ``mcp_tool_call`` and ``mcp_tool_denied`` entries (the last one counts)."""
    facts: dict[str, CallFact] = {}
    for entry in entries:
        kind = entry.kind
        if kind not in ("mcp_tool_call", "mcp_tool_denied"):
            continue
        body: Mapping[str, Any] = entry.body
        call, tool = str(body.get("call")), str(body.get("tool"))
        args = body.get("args") if isinstance(body.get("args"), str) else None
        seq, digest = getattr(entry, "seq", None), getattr(entry, "hash", None)
        if kind == "mcp_tool_denied":
            detail = f"denied ({body.get('code')}): {body.get('reason')}"
            facts[call] = CallFact(call, tool, "denied", kind, seq, digest, detail, args, None)
            continue
        failure: Any = body.get("failure")
        result = body.get("result") if isinstance(body.get("result"), str) else None
        if isinstance(failure, dict):
            cause = cast(dict[str, Any], failure).get("cause")
            facts[call] = CallFact(call, tool, "failed", kind, seq, digest, f"failed ({cause})", args, result)
        elif body.get("is_error") is True:
            facts[call] = CallFact(call, tool, "error", kind, seq, digest, "returned an error result", args, result)
        else:
            facts[call] = CallFact(call, tool, "ok", kind, seq, digest, "succeeded", args, result)
    return facts


@dataclass(frozen=True)
class Finding:
    """Something wrong with the answer's claims that Truss finds itself, before any reviewer."""

    finding: str  # unknown_call | denied_call | failed_call | no_claims | too_many_claims | answer_too_long
    detail: str
    claim: int | None = None
    call: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"finding": self.finding, "detail": self.detail}
        if self.claim is not None:
            out["claim"] = self.claim
        if self.call is not None:
            out["call"] = self.call
        return out


@dataclass(frozen=True)
class Reading:
    """The final answer as the panel reads it: claims, the cited calls the record has, Truss's findings."""

    answer: str
    claims: tuple[Claim, ...]
    cited: tuple[CallFact, ...]  # each cited id the session has, in order of first citation
    findings: tuple[Finding, ...]

    @property
    def given(self) -> tuple[str, ...]:
        """The call ids a reviewer is given (and may rely on): the cited calls that succeeded."""
        return tuple(c.call for c in self.cited if c.status == "ok")


def read_answer(answer: str, entries: Iterable[Any]) -> Reading:
    """Claims and citations of ``answer`` checked against the session's recorded calls."""
    if len(answer) > MAX_ANSWER_CHARS:
        finding = Finding("answer_too_long", f"the final answer has {len(answer)} characters, over {MAX_ANSWER_CHARS}")
        return Reading(answer, (), (), (finding,))
    claims = parse_claims(answer)
    if not claims:
        return Reading(answer, (), (), (Finding("no_claims", "the final answer states no claim"),))
    if len(claims) > MAX_CLAIMS:
        finding = Finding("too_many_claims", f"the final answer has {len(claims)} claims, over {MAX_CLAIMS}")
        return Reading(answer, tuple(claims[:MAX_CLAIMS]), (), (finding,))
    facts = call_facts(entries)
    cited: dict[str, CallFact] = {}
    findings: list[Finding] = []
    for claim in claims:
        for call in claim.cites:
            fact = facts.get(call)
            if fact is None:
                detail = f"claim {claim.index} cites {call}, which the session does not have"
                findings.append(Finding("unknown_call", detail, claim.index, call))
                continue
            cited.setdefault(call, fact)
            if fact.status == "denied":
                detail = f"claim {claim.index} cites {call} ({fact.tool}), which was {fact.detail}"
                findings.append(Finding("denied_call", detail, claim.index, call))
            elif fact.status != "ok":
                detail = f"claim {claim.index} cites {call} ({fact.tool}), which {fact.detail}"
                findings.append(Finding("failed_call", detail, claim.index, call))
    return Reading(answer, tuple(claims), tuple(cited.values()), tuple(findings))


def final_answer(entries: Iterable[Any], blob: Blob) -> tuple[str | None, str]:
    """The final answer as recorded (the text of the last ``model_turn``, which asked for no call), or
    None and why there is none."""
    last: Any = None
    for entry in entries:
        if entry.kind == "model_turn":
            last = entry
    if last is None:
        return None, "the model gave no answer"
    body: Mapping[str, Any] = last.body
    if body.get("tool_calls") not in (0, None):
        return None, f"the last model turn ({body.get('turn')}) asked for calls: the model gave no final answer"
    ref = body.get("response")
    data = blob(ref) if isinstance(ref, str) else None
    if data is None:
        return None, f"the response of model turn {body.get('turn')} is not stored (erased)"
    try:
        response: Any = json.loads(data)
    except ValueError:
        return None, f"the response of model turn {body.get('turn')} is not JSON"
    text: Any = cast(dict[str, Any], response).get("text") if isinstance(response, dict) else None
    if not isinstance(text, str):
        return None, f"the response of model turn {body.get('turn')} has no text"
    return text, ""


# -- the reviewer's form -----------------------------------------------------------------------------


def review_schema(claims: int, calls: Collection[str]) -> dict[str, Any]:
    """The JSON schema of a review of ``claims`` claims that may rely on ``calls`` (the tool's input schema)."""
    call_item: dict[str, Any] = {"type": "string", "enum": list(calls)} if calls else {"type": "string"}
    judgement = {
        "type": "object",
        "additionalProperties": False,
        "required": ["claim", "judgement", "calls"],
        "properties": {
            "claim": {"type": "integer", "minimum": 0, "maximum": max(0, claims - 1)},
            "judgement": {"type": "string", "enum": list(JUDGEMENTS)},
            "calls": {"type": "array", "items": call_item, "uniqueItems": True},
            "reason": {"type": "string", "maxLength": MAX_REASON_CHARS},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["claims"],
        "properties": {
            "claims": {"type": "array", "items": judgement, "minItems": claims, "maxItems": claims},
            "summary": {"type": "string", "maxLength": MAX_SUMMARY_CHARS},
        },
    }


@dataclass(frozen=True)
class Judgement:
    claim: int
    judgement: str
    calls: tuple[str, ...]
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"claim": self.claim, "judgement": self.judgement, "calls": list(self.calls)}


@dataclass(frozen=True)
class Review:
    """A valid answer: one judgement per claim, in claim order."""

    judgements: tuple[Judgement, ...]
    summary: str = ""

    @property
    def approves(self) -> bool:
        return all(j.judgement == "supported" for j in self.judgements)

    def against(self) -> list[Judgement]:
        return [j for j in self.judgements if j.judgement != "supported"]


def submission_of(response: Any) -> tuple[Any, str | None]:
    """The form a reviewer submitted, from its provider-neutral response JSON: the arguments of its one
    ``submit_review`` call, or (a server that ignores tool choice) its whole text as a JSON object."""
    if not isinstance(response, dict):
        return None, "the response is not a JSON object"
    answer = cast(dict[str, Any], response)
    calls: Any = answer.get("tool_calls") or []
    if not isinstance(calls, list):
        return None, "the response's tool_calls is not a list"
    listed = cast(list[Any], calls)
    if listed:
        if len(listed) != 1:
            return None, f"the reviewer made {len(listed)} tool calls; the form is one call of {SUBMIT_TOOL}"
        call: Any = listed[0]
        name = cast(dict[str, Any], call).get("name") if isinstance(call, dict) else None
        if name != SUBMIT_TOOL:
            return None, f"the reviewer called {str(name)[:64]!r}, not {SUBMIT_TOOL}"
        arguments: Any = cast(dict[str, Any], call).get("arguments")
        if not isinstance(arguments, dict):
            return None, f"the arguments of {SUBMIT_TOOL} are not a JSON object"
        return cast(dict[str, Any], arguments), None
    text: Any = answer.get("text")
    if not isinstance(text, str) or not text.strip():
        return None, f"the reviewer neither called {SUBMIT_TOOL} nor answered with a JSON object"
    try:
        value: Any = json.loads(text)
    except (ValueError, RecursionError):
        return None, f"the reviewer did not call {SUBMIT_TOOL} and its text is not JSON"
    if not isinstance(value, dict):
        return None, f"the reviewer did not call {SUBMIT_TOOL} and its text is not a JSON object"
    return cast(dict[str, Any], value), None


def check_review(value: Any, *, claims: int, calls: Collection[str]) -> Review | str:
    """``value`` as a valid ``Review`` of ``claims`` claims relying only on ``calls``, or the first problem."""
    if not isinstance(value, dict):
        return "the review is not a JSON object"
    form = cast(dict[str, Any], value)
    extra = sorted(set(form) - {"claims", "summary"})
    if extra:
        return f"the review has members the form does not: {', '.join(repr(k[:40]) for k in extra[:3])}"
    summary: Any = form.get("summary", "")
    if not isinstance(summary, str) or len(summary) > MAX_SUMMARY_CHARS:
        return f"summary is not a string of at most {MAX_SUMMARY_CHARS} characters"
    items: Any = form.get("claims")
    if not isinstance(items, list):
        return "claims is not a list"
    listed = cast(list[Any], items)
    if len(listed) != claims:
        return f"the review judges {len(listed)} claim(s); the answer has {claims}"
    allowed = set(calls)
    seen: dict[int, Judgement] = {}
    for position, raw in enumerate(listed):
        problem = _judgement(raw, position, claims, allowed)
        if isinstance(problem, str):
            return problem
        if problem.claim in seen:
            return f"claims[{position}] judges claim {problem.claim} a second time"
        seen[problem.claim] = problem
    return Review(tuple(seen[i] for i in range(claims)), summary)


def _judgement(raw: Any, position: int, claims: int, allowed: set[str]) -> Judgement | str:
    where = f"claims[{position}]"
    if not isinstance(raw, dict):
        return f"{where} is not an object"
    item = cast(dict[str, Any], raw)
    extra = sorted(set(item) - {"claim", "judgement", "calls", "reason"})
    if extra:
        return f"{where} has members the form does not: {', '.join(repr(k[:40]) for k in extra[:3])}"
    claim: Any = item.get("claim")
    if not isinstance(claim, int) or isinstance(claim, bool) or not 0 <= claim < claims:
        return f"{where}.claim is not a claim number from 0 to {claims - 1}"
    judgement: Any = item.get("judgement")
    if judgement not in JUDGEMENTS:
        return f"{where}.judgement is not one of {', '.join(JUDGEMENTS)}"
    relied: Any = item.get("calls")
    if not isinstance(relied, list) or not all(isinstance(c, str) for c in cast(list[Any], relied)):
        return f"{where}.calls is not a list of call ids"
    ids = cast(list[str], relied)
    if len(set(ids)) != len(ids):
        return f"{where}.calls names a call twice"
    unknown = [c for c in ids if c not in allowed]
    if unknown:
        return (
            f"{where} relies on {unknown[0][:40]!r}, which is not one of the calls the reviewer was given "
            f"({', '.join(sorted(allowed)) or 'none'})"
        )
    if judgement != "unsupported" and not ids:
        return f"{where} says {judgement} but names no call it relied on"
    reason: Any = item.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        return f"{where}.reason is not a string of at most {MAX_REASON_CHARS} characters"
    return Judgement(claim, str(judgement), tuple(ids), reason)


def judge_response(response: Any, *, claims: int, calls: Collection[str]) -> tuple[Review | None, str]:
    """A reviewer's recorded response judged: its valid review and a one-line reason, or None and why
    it is malformed."""
    value, problem = submission_of(response)
    if problem is not None:
        return None, problem
    review = check_review(value, claims=claims, calls=calls)
    if isinstance(review, str):
        return None, review
    against = review.against()
    if not against:
        return review, f"every claim supported ({claims})"
    first = against[0]
    more = f" and {len(against) - 1} more" if len(against) > 1 else ""
    return review, f"claim {first.claim} {first.judgement}{more}"
