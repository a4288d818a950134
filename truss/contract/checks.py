"""Done checks: the ``[[done.checks]]`` model, the registry of check kinds, and the built-in kinds.

A check's ``kind`` is looked up in a registry of ``CheckKind`` when the contract loads: a kind
that is not registered is refused there with its key path (fail closed), so no check can reach
the verdict without its own evaluation. A kind says which of the check's keys it needs
(``tool``; ``regex`` or ``equals``) and may check more (``validate``); its ``evaluate`` reads the
session's ``Evidence`` (the recorded calls, denials, final answer and payloads) and returns
``Checked(ok, detail)``. ``truss.verdict`` gathers the evidence from the ledger and turns the
results into the verdict. A program or a test adds a kind with ``DONE_CHECKS.register(kind)``
(or its own registry, given to the loader and to ``truss.verdict.evaluate``).

The built-in kinds:

- ``tool_succeeded``: the tool was called and its *last* call returned a result without
  ``isError`` (a model may retry after an error; what it ended with counts).
- ``result_matches``: the last successful call of the tool has, at ``pointer``, a value that
  ``equals`` the given JSON value or whose text matches ``regex`` (searched: the pattern may
  match anywhere; anchor it with ``^``/``$`` to match all). Patterns run on RE2
  (``truss._regex.linear_regex``), linear in the text whatever the pattern: a pattern RE2
  refuses (look-around, back-references) is refused when the contract loads. ``pointer = ""`` means the result's
  text; any other pointer (RFC 6901) reads ``structuredContent``, or the text parsed as JSON when
  the server sent no structured content. A non-string value is matched as compact JSON.
- ``final_matches``: the model's final answer, with ``equals`` or ``regex`` as above.
- ``no_denials``: no call was denied (by policy, budget, a person or a bad request); with
  ``tool`` set, no call of that tool was.
- ``panel`` (``truss.contract.panel``): reviewers judge the final answer's claims against the
  calls they cite; its keys are ``reviewers``, ``quorum``, ``rubric``, ``max_tokens`` and
  ``deadline``, which no other kind takes.

``tool_succeeded`` and ``result_matches`` take ``select``, which calls of the tool they look at:
``last`` (the default: the last call, or the last successful one for ``result_matches``),
``first`` (likewise the first), ``any`` (at least one call succeeds, and matches), ``all`` (every
call of the tool succeeded, and matches; there is at least one), or ``call:<id>`` (that call,
such as ``call:c2.0``: it must be a call of the tool that succeeded, and matches).

A kind may also say how to fold its check entry by entry (``CheckKind.fold``: a ``CheckFold``
given each recorded call and denial as the run appends them, asked for its ``Checked`` at the
end), so a long run's verdict needs no record of every call. Each built-in kind but ``panel``
folds into at most a few remembered calls, a counter and a flag per check: ``last`` and ``first``
remember one call, ``any`` and ``all`` match each successful result as it comes (remembering the
first hit or miss), ``call:<id>`` remembers the named call. A fold reaches the same ``Checked`` as
the kind's ``evaluate`` over the whole record (``tests/contract/test_verdict_fold.py``); a kind
without a fold (the panel, which reads the final answer's citations) is evaluated over the whole
record, which the run then keeps.

Pure: evaluation reads payloads only through the ``blob`` function it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from pydantic import Field, ValidationInfo, field_validator, model_validator

from truss._pointer import resolve_pointer
from truss._regex import NotLinearError, linear_regex
from truss._registry import Registry
from truss.contract.fields import TOOL_REF_RE, Duration, KeyValueError, Model, Pointer, PositiveInt, Regex
from truss.contract.reviewers import Reviewer
from truss.ledger.canonical import CanonicalError, canonical

__all__ = [
    "DONE_CHECKS",
    "CallRecord",
    "CheckFold",
    "CheckKind",
    "Checked",
    "DoneCheck",
    "Evidence",
    "check_kinds_in",
    "match_value",
    "value_at",
]

MAX_MATCH_CHARS = 1_048_576
"""The most text a ``regex`` check searches (checks run on recorded results, which ``max_result_bytes`` bounds)."""

SELECTIONS = ("last", "first", "any", "all")
"""The values of a check's ``select`` besides ``call:<id>``."""
_CALL_SELECT = re.compile(r"call:[A-Za-z0-9_.:-]{1,64}")

KIND_KEYS = frozenset({"reviewers", "quorum", "rubric", "max_tokens", "deadline"})
"""Keys only the kinds that declare them (``CheckKind.keys``) take: a check of another kind refuses them."""


class DoneCheck(Model):
    """One ``[[done.checks]]`` table. Which keys a check needs depends on its kind."""

    kind: str
    tool: str | None = None
    pointer: Pointer = ""
    regex: Regex | None = None
    equals: Any = None
    reviewers: list[Reviewer] | None = None
    quorum: int | None = None
    rubric: str | None = Field(default=None, min_length=1, max_length=20_000)
    max_tokens: PositiveInt | None = None
    deadline: Duration | None = None
    select: str | None = None  # which calls of the tool: see the module docstring

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        if value is None or value in SELECTIONS or _CALL_SELECT.fullmatch(value):
            return value
        raise KeyValueError(
            f"select {value!r} is not one of {', '.join(SELECTIONS)} or call:<id>",
            remedy='Use "last" (the default), "first", "any", "all", or a call id such as "call:c2.0"',
        )

    @field_validator("kind")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        kinds = check_kinds_in(info.context)
        if value not in kinds:
            raise KeyValueError(
                kinds.unknown(value),
                remedy="Use one of the kinds docs/contracts.md lists, or register yours in truss.contract.DONE_CHECKS",
            )
        return value

    @field_validator("regex")
    @classmethod
    def _linear(cls, value: str | None) -> str | None:
        # A check's text is a tool result or the model's answer: untrusted, up to a megabyte.
        # Only a pattern the linear-time engine runs is accepted, so no check can hang a run.
        if value is not None:
            try:
                linear_regex(value)
            except NotLinearError as exc:
                raise KeyValueError(
                    f"regex {value!r} cannot be matched in linear time ({exc.reason}); a done check's text comes "
                    "from a tool or the model, so Truss runs its pattern on RE2, which has no look-around or "
                    "back-references",
                    remedy="Rewrite the pattern without look-around ((?=, (?!, (?<=, (?<!) and back-references (\\1)",
                ) from None
        return value

    @model_validator(mode="after")
    def _fields_for_kind(self, info: ValidationInfo) -> DoneCheck:
        kind = check_kinds_in(info.context).get(self.kind)
        if kind is None:  # _registered refused it already
            return self
        foreign = sorted(k for k in KIND_KEYS & self.model_fields_set if k not in kind.keys)
        if foreign:
            raise ValueError(f"a {self.kind} check takes no {foreign[0]}")
        if self.select is not None and not kind.selects:
            raise ValueError(f"a {self.kind} check takes no select")
        if kind.needs_tool and not self.tool:
            raise ValueError(f"a {self.kind} check needs a tool")
        if self.tool is not None and not TOOL_REF_RE.match(self.tool):
            raise ValueError(f"tool {self.tool!r} must be a namespaced name 'mcp:<server>:<tool>'")
        if kind.needs_match and self.regex is None and "equals" not in self.model_fields_set:
            raise ValueError(f"a {self.kind} check needs regex or equals")
        problem = kind.validate(self) if kind.validate is not None else None
        if problem:
            raise ValueError(problem)
        return self


@dataclass(frozen=True)
class CallRecord:
    """One recorded ``mcp_tool_call``: ``failure`` is its failure cause when the call failed below the tool."""

    tool: str
    call: str
    is_error: bool
    result_ref: str | None
    failure: str | None


@dataclass(frozen=True)
class Evidence:
    """What a session recorded, as done checks read it: calls and denials in order, the final answer.

    ``entries`` are the session's entries (``kind``, ``body``, ``seq``, ``hash``) for kinds that read
    more than calls (the panel reads its ``panel_review`` entries); ``check_index`` is the position
    of the check being evaluated in ``[[done.checks]]``.
    """

    calls: Sequence[CallRecord]
    denials: Sequence[str]  # the tool of each denied call
    final_text: str | None
    blob: Callable[[str], bytes | None]
    entries: Sequence[Any] = ()
    check_index: int = -1

    def calls_of(self, tool: str | None) -> list[CallRecord]:
        return [c for c in self.calls if c.tool == tool]

    def payload(self, call: CallRecord) -> Any | None:
        """The recorded result of ``call`` as JSON, or None when it has none or its payload was erased."""
        data = self.blob(call.result_ref) if call.result_ref else None
        return None if data is None else json.loads(data)


@dataclass(frozen=True)
class Checked:
    """A check's result. ``extra``: more members for the check's entry in the verdict (never ``index``,
    ``kind``, ``ok``, ``detail`` or ``tool``). ``cause``: set on a failure that means the check could
    not be decided rather than that it does not hold: the verdict is then ``error`` with this cause."""

    ok: bool
    detail: str
    extra: Mapping[str, Any] | None = None
    cause: str | None = None


class CheckFold(Protocol):
    """One check folded as the run goes: each recorded call and denial in order, then the result."""

    def call(self, call: CallRecord) -> None: ...

    def denial(self, tool: str) -> None: ...

    def checked(self, final_text: str | None) -> Checked: ...


@dataclass(frozen=True)
class CheckKind:
    """A done-check kind: its name, the keys it needs, its evaluation; ``fold`` (optional) builds a
    ``CheckFold`` for one check, given the check and the payload reader."""

    name: str
    evaluate: Callable[[DoneCheck, Evidence], Checked]
    needs_tool: bool = False
    needs_match: bool = False  # regex or equals
    validate: Callable[[DoneCheck], str | None] | None = None  # more checks at load: the problem, or None
    summary: str = ""
    keys: frozenset[str] = frozenset()  # which of KIND_KEYS it takes
    selects: bool = False  # takes ``select`` (which calls of its tool it looks at)
    fold: Callable[[DoneCheck, Callable[[str], bytes | None]], CheckFold] | None = None


def match_value(check: DoneCheck, value: Any) -> Checked:
    """``value`` against the check's ``equals`` (JSON equality) or ``regex`` (searched in its text)."""
    if "equals" in check.model_fields_set:
        ok = _json_equal(value, check.equals)
        return Checked(ok, "equals the expected value" if ok else "does not equal the expected value")
    pattern = check.regex or ""
    text = value if isinstance(value, str) else canonical(value).decode("utf-8")
    ok = linear_regex(pattern).search(text[:MAX_MATCH_CHARS])
    return Checked(ok, f"matches /{pattern}/" if ok else f"does not match /{pattern}/")


def value_at(result: Any, pointer: str) -> tuple[bool, Any]:
    """What a check's ``pointer`` finds in a recorded tool result: ``""`` is its text (see the module docstring)."""
    if not isinstance(result, dict):
        return False, None
    wire = cast(dict[str, Any], result)
    if pointer == "":
        return True, _text(wire)
    document: Any = wire.get("structuredContent")
    if document is None:
        try:
            document = json.loads(_text(wire))
        except (ValueError, RecursionError):
            return False, None
    return resolve_pointer(document, pointer)


def _json_equal(a: Any, b: Any) -> bool:
    try:
        return canonical(a) == canonical(b)
    except (CanonicalError, ValueError):
        return False


def _text(result: Mapping[str, Any]) -> str:
    parts: list[str] = []
    content: Any = result.get("content") or []
    for item in cast(list[Any], content) if isinstance(content, list) else []:
        if isinstance(item, dict):
            block = cast(dict[str, Any], item)
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
    return "\n".join(parts)


# -- the built-in kinds -----------------------------------------------------------------------------


def _selected(check: DoneCheck, calls: list[CallRecord]) -> list[CallRecord] | str:
    """The calls a ``call:<id>`` select names among ``calls``, or why there is none."""
    wanted = (check.select or "").removeprefix("call:")
    named = [c for c in calls if c.call == wanted]
    return named or f"{check.tool} has no call {wanted}"


def _tool_succeeded(check: DoneCheck, evidence: Evidence) -> Checked:
    tool = check.tool
    of_tool = evidence.calls_of(tool)
    if not of_tool:
        return Checked(False, f"{tool} was never called")
    select = check.select or "last"
    if select == "any":
        good = next((c for c in of_tool if not c.is_error), None)
        if good is None:
            return Checked(False, f"no call of {tool} succeeded ({len(of_tool)} call(s))")
        return Checked(True, f"{tool} succeeded ({good.call})")
    if select == "all":
        bad = next((c for c in of_tool if c.is_error), None)
        if bad is None:
            return Checked(True, f"all {len(of_tool)} call(s) of {tool} succeeded")
        picked = bad
    elif select in ("first", "last"):
        picked = of_tool[0] if select == "first" else of_tool[-1]
    else:
        named = _selected(check, of_tool)
        if isinstance(named, str):
            return Checked(False, named)
        picked = named[0]
    if picked.is_error:
        why = f"failed ({picked.failure})" if picked.failure else "returned an error result"
        which = {"first": "the first", "last": "the last", "all": "a"}.get(select, "the selected")
        return Checked(False, f"{which} call of {tool} ({picked.call}) {why}")
    return Checked(True, f"{tool} succeeded ({picked.call})")


def _matches_at(check: DoneCheck, evidence: Evidence, call: CallRecord) -> Checked:
    result = evidence.payload(call)
    if result is None:
        return Checked(False, f"the result of {call.call} is not available (payload erased)")
    found, value = value_at(result, check.pointer)
    if not found:
        return Checked(False, f"{call.call}: nothing at pointer {check.pointer!r}")
    matched = match_value(check, value)
    where = f"{call.call} at {check.pointer!r}" if check.pointer else f"{call.call} text"
    return Checked(matched.ok, f"{where} {matched.detail}")


def _result_matches(check: DoneCheck, evidence: Evidence) -> Checked:
    tool = check.tool
    of_tool = evidence.calls_of(tool)
    good = [c for c in of_tool if not c.is_error]
    select = check.select or "last"
    if select.startswith("call:"):
        named = _selected(check, of_tool)
        if isinstance(named, str):
            return Checked(False, named)
        if named[0].is_error:
            return Checked(False, f"{named[0].call} ({tool}) returned no successful result")
        return _matches_at(check, evidence, named[0])
    if not good:
        return Checked(False, f"{tool} has no successful result")
    if select in ("first", "last"):
        return _matches_at(check, evidence, good[0] if select == "first" else good[-1])
    if select == "all" and len(good) < len(of_tool):
        bad = next(c for c in of_tool if c.is_error)
        return Checked(False, f"{bad.call} ({tool}) returned no successful result")
    results = [_matches_at(check, evidence, c) for c in good]
    if select == "any":
        hit = next((r for r in results if r.ok), None)
        return hit or Checked(False, f"no result of {tool} matches ({len(good)} successful): {results[-1].detail}")
    miss = next((r for r in results if not r.ok), None)
    return miss or Checked(True, f"all {len(good)} result(s) of {tool} match")


def _final_matches(check: DoneCheck, evidence: Evidence) -> Checked:
    if evidence.final_text is None:
        return Checked(False, "the model gave no final answer")
    matched = match_value(check, evidence.final_text)
    return Checked(matched.ok, f"final answer {matched.detail}")


def _no_denials(check: DoneCheck, evidence: Evidence) -> Checked:
    hits = [t for t in evidence.denials if check.tool is None or t == check.tool]
    if hits:
        return Checked(False, f"{len(hits)} call(s) were denied")
    return Checked(True, "no call was denied")


# -- the built-in kinds, folded call by call (the same answers as above, see CheckFold) --------------


class _Fold:
    """What every built-in fold remembers of the calls of its check's tool."""

    def __init__(self, check: DoneCheck, blob: Callable[[str], bytes | None]) -> None:
        self.check = check
        self.blob = blob
        self.select = check.select or "last"
        self.wanted = self.select.removeprefix("call:") if self.select.startswith("call:") else None
        self.count = 0  # calls of the tool
        self.first: CallRecord | None = None
        self.last: CallRecord | None = None
        self.named: CallRecord | None = None  # the first call of the tool with the wanted id
        self.first_bad: CallRecord | None = None  # the first that returned an error

    def call(self, call: CallRecord) -> None:
        if call.tool != self.check.tool:
            return
        self.count += 1
        self.first = self.first or call
        self.last = call
        if self.named is None and self.wanted is not None and call.call == self.wanted:
            self.named = call
        if call.is_error and self.first_bad is None:
            self.first_bad = call
        self.more(call)

    def more(self, call: CallRecord) -> None:
        return None

    def denial(self, tool: str) -> None:
        return None

    def evidence(self) -> Evidence:
        return Evidence(calls=(), denials=(), final_text=None, blob=self.blob)


class _ToolSucceededFold(_Fold):
    def __init__(self, check: DoneCheck, blob: Callable[[str], bytes | None]) -> None:
        super().__init__(check, blob)
        self.good: CallRecord | None = None  # the first that succeeded

    def more(self, call: CallRecord) -> None:
        if not call.is_error and self.good is None:
            self.good = call

    def checked(self, final_text: str | None) -> Checked:
        tool, select = self.check.tool, self.select
        if self.count == 0:
            return Checked(False, f"{tool} was never called")
        if select == "any":
            good = self.good
            if good is None:
                return Checked(False, f"no call of {tool} succeeded ({self.count} call(s))")
            return Checked(True, f"{tool} succeeded ({good.call})")
        if select == "all":
            if self.first_bad is None:
                return Checked(True, f"all {self.count} call(s) of {tool} succeeded")
            picked = self.first_bad
        elif select in ("first", "last"):
            picked = self.first if select == "first" else self.last
        else:
            if self.named is None:
                return Checked(False, f"{tool} has no call {self.wanted}")
            picked = self.named
        assert picked is not None  # count > 0
        if picked.is_error:
            why = f"failed ({picked.failure})" if picked.failure else "returned an error result"
            which = {"first": "the first", "last": "the last", "all": "a"}.get(select, "the selected")
            return Checked(False, f"{which} call of {tool} ({picked.call}) {why}")
        return Checked(True, f"{tool} succeeded ({picked.call})")


class _ResultMatchesFold(_Fold):
    def __init__(self, check: DoneCheck, blob: Callable[[str], bytes | None]) -> None:
        super().__init__(check, blob)
        self.good = 0
        self.first_good: CallRecord | None = None
        self.last_good: CallRecord | None = None
        self.found: Checked | None = None  # any: the first hit; all: the first miss
        self.latest: Checked | None = None  # the latest successful result's match
        self.raised: Exception | None = None  # the first evaluation that raised (re-raised at the end)

    def more(self, call: CallRecord) -> None:
        if call.is_error:
            return
        self.good += 1
        self.first_good = self.first_good or call
        self.last_good = call
        if self.select not in ("any", "all") or self.raised is not None:
            return
        if self.select == "all" and self.first_bad is not None:
            return  # the first error decides already
        try:
            matched = _matches_at(self.check, self.evidence(), call)
        except Exception as exc:  # the whole-record evaluation raises it: so does checked()
            self.raised = exc
            return
        self.latest = matched
        if self.found is None and matched.ok == (self.select == "any"):
            self.found = matched

    def checked(self, final_text: str | None) -> Checked:
        tool, select = self.check.tool, self.select
        if self.wanted is not None:
            if self.named is None:
                return Checked(False, f"{tool} has no call {self.wanted}")
            if self.named.is_error:
                return Checked(False, f"{self.named.call} ({tool}) returned no successful result")
            return _matches_at(self.check, self.evidence(), self.named)
        if self.good == 0:
            return Checked(False, f"{tool} has no successful result")
        if select in ("first", "last"):
            picked = self.first_good if select == "first" else self.last_good
            assert picked is not None
            return _matches_at(self.check, self.evidence(), picked)
        if select == "all" and self.first_bad is not None:
            return Checked(False, f"{self.first_bad.call} ({tool}) returned no successful result")
        if self.raised is not None:
            raise self.raised
        if select == "any":
            assert self.latest is not None
            return self.found or Checked(
                False, f"no result of {tool} matches ({self.good} successful): {self.latest.detail}"
            )
        return self.found or Checked(True, f"all {self.good} result(s) of {tool} match")


class _FinalMatchesFold(_Fold):
    def checked(self, final_text: str | None) -> Checked:
        return _final_matches(self.check, replace(self.evidence(), final_text=final_text))


class _NoDenialsFold(_Fold):
    def __init__(self, check: DoneCheck, blob: Callable[[str], bytes | None]) -> None:
        super().__init__(check, blob)
        self.hits = 0

    def call(self, call: CallRecord) -> None:
        return None

    def denial(self, tool: str) -> None:
        if self.check.tool is None or tool == self.check.tool:
            self.hits += 1

    def checked(self, final_text: str | None) -> Checked:
        if self.hits:
            return Checked(False, f"{self.hits} call(s) were denied")
        return Checked(True, "no call was denied")


DONE_CHECKS: Registry[CheckKind] = Registry(
    "done-check kind",
    [
        CheckKind(
            "tool_succeeded",
            _tool_succeeded,
            fold=_ToolSucceededFold,
            needs_tool=True,
            summary="the tool's last call succeeded",
            selects=True,
        ),
        CheckKind(
            "result_matches",
            _result_matches,
            fold=_ResultMatchesFold,
            needs_tool=True,
            needs_match=True,
            summary="the tool's last successful result matches",
            selects=True,
        ),
        CheckKind(
            "final_matches",
            _final_matches,
            fold=_FinalMatchesFold,
            needs_match=True,
            summary="the final answer matches",
        ),
        CheckKind("no_denials", _no_denials, fold=_NoDenialsFold, summary="no call (of the tool) was denied"),
    ],
)
"""The done-check kinds contracts are loaded and verdicts evaluated against unless given another registry."""

CONTEXT_KEY = "truss.check_kinds"
"""The key of a check-kind registry in a pydantic validation context (``Contract.model_validate``)."""


def check_kinds_in(context: object) -> Registry[CheckKind]:
    """The registry a validation ``context`` carries, or ``DONE_CHECKS``."""
    if isinstance(context, Mapping):
        found = cast(Mapping[str, Any], context).get(CONTEXT_KEY)
        if isinstance(found, Registry):
            return cast(Registry[CheckKind], found)
    return DONE_CHECKS
