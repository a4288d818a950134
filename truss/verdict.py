"""Done checks -> the verdict of a run: ``pass``, ``fail`` (which check, why) or ``error`` (which cause).

The verdict is computed from the session's recorded entries and payloads, not from live state, so
that an auditor replaying a finished session from its ledger reaches the same verdict
(``evaluate`` takes entries and a blob reader). The checks (contract ``[[done.checks]]``):

- ``tool_succeeded``: the tool was called and its *last* call returned a result without
  ``isError`` (a model may retry after an error; what it ended with counts).
- ``result_matches``: the last successful call of the tool has, at ``pointer``, a value that
  ``equals`` the given JSON value or whose text matches ``regex`` (``re.search``: the pattern may
  match anywhere; anchor it with ``^``/``$`` to match all). ``pointer = ""`` means the result's
  text; any other pointer reads ``structuredContent``, or the text parsed as JSON when the server
  sent no structured content. A non-string value is matched as compact JSON.
- ``final_matches``: the model's final answer, with ``equals`` or ``regex`` as above.
- ``no_denials``: no call was denied (by policy, budget, a person or a bad request); with
  ``tool`` set, no call of that tool was.

Status: ``error`` when the run could not finish (a budget or the deadline stopped it, the provider
failed) or when a check failed and a call had failed *below* the tool (a server crashed, timed out
or broke the protocol) or had been refused for budget: then the work could not be done, which is
not the same as done wrong.
Otherwise ``pass`` when every check holds and ``fail`` naming the first that does not. The checks
are evaluated and reported in every case. This module is pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from truss.contract import Contract, DoneCheck
from truss.ledger.canonical import canonical

__all__ = ["CheckResult", "RunError", "Verdict", "evaluate", "resolve_pointer"]

Status = Literal["pass", "fail", "error"]
_BELOW_TOOL = {"timeout", "connection_closed", "protocol_error", "transport", "invalid_result", "pin_changed"}
_MAX_MATCH_CHARS = 1_048_576  # checks run on recorded results, which max_result_bytes already bounds


@dataclass(frozen=True)
class RunError:
    """Why a run could not finish: ``cause`` is ``budget``, ``deadline``, ``provider`` or ``server``."""

    cause: str
    detail: str
    limit: str | None = None


@dataclass(frozen=True)
class CheckResult:
    index: int
    kind: str
    ok: bool
    detail: str
    tool: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "kind": self.kind, "ok": self.ok, "detail": self.detail}
        if self.tool is not None:
            out["tool"] = self.tool
        return out


@dataclass(frozen=True)
class Verdict:
    status: Status
    checks: list[CheckResult] = field(default_factory=list[CheckResult])
    reason: str | None = None
    error: RunError | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "checks": [c.to_json() for c in self.checks],
            "reason": self.reason,
        }
        if self.error is not None:
            out["error"] = {"cause": self.error.cause, "detail": self.error.detail}
            if self.error.limit is not None:
                out["error"]["limit"] = self.error.limit
        return out


@dataclass
class _Call:
    tool: str
    call: str
    is_error: bool
    result_ref: str | None
    failure: str | None


def evaluate(
    contract: Contract,
    entries: Iterable[Any],
    blob: Callable[[str], bytes | None],
    *,
    final_text: str | None,
    error: RunError | None = None,
) -> Verdict:
    """The verdict of a session from its entries (anything with ``kind`` and ``body``) and payloads."""
    calls: list[_Call] = []
    denials: list[str] = []
    budget_denial: tuple[str, str, str | None] | None = None  # call, reason, limit of the first
    for entry in entries:
        body: Mapping[str, Any] = entry.body
        if entry.kind == "mcp_tool_call":
            failure = _as_dict(body.get("failure"))
            calls.append(
                _Call(
                    tool=str(body.get("tool")),
                    call=str(body.get("call")),
                    is_error=body.get("is_error") is True,
                    result_ref=body.get("result") if isinstance(body.get("result"), str) else None,
                    failure=str(failure.get("cause")) if failure is not None else None,
                )
            )
        elif entry.kind == "mcp_tool_denied":
            denials.append(str(body.get("tool")))
            if body.get("code") == "budget" and budget_denial is None:
                limit = body.get("limit")
                budget_denial = (str(body.get("call")), str(body.get("reason")), str(limit) if limit else None)
    checks = [_check(i, c, calls, denials, blob, final_text) for i, c in enumerate(contract.done.checks)]
    failed = next((c for c in checks if not c.ok), None)
    if error is not None:
        return Verdict("error", checks, f"the run could not finish: {error.detail}", error)
    if failed is not None:
        broken = next((c for c in calls if c.failure in _BELOW_TOOL), None)
        if broken is not None:
            server = broken.tool.split(":")[1] if broken.tool.count(":") >= 2 else broken.tool
            detail = f"call {broken.call} ({broken.tool}) failed below the tool ({broken.failure})"
            return Verdict(
                "error",
                checks,
                f"the run could not finish: {detail}; check {failed.index} ({failed.kind}) then failed",
                RunError("server", f"server {server!r}: {detail}"),
            )
        if budget_denial is not None:
            call, reason, limit = budget_denial
            detail = f"call {call} was refused: {reason}"
            return Verdict(
                "error",
                checks,
                f"the run could not finish: {detail}; check {failed.index} ({failed.kind}) then failed",
                RunError("budget", detail, limit),
            )
        return Verdict("fail", checks, f"check {failed.index} ({failed.kind}) failed: {failed.detail}")
    return Verdict("pass", checks, None)


def _check(  # noqa: PLR0917 - one private call site
    index: int,
    check: DoneCheck,
    calls: list[_Call],
    denials: list[str],
    blob: Callable[[str], bytes | None],
    final_text: str | None,
) -> CheckResult:
    kind = check.kind
    tool = check.tool
    if kind == "no_denials":
        hits = [t for t in denials if tool is None or t == tool]
        if hits:
            return CheckResult(index, kind, False, f"{len(hits)} call(s) were denied", tool)
        return CheckResult(index, kind, True, "no call was denied", tool)
    if kind == "final_matches":
        if final_text is None:
            return CheckResult(index, kind, False, "the model gave no final answer", tool)
        ok, detail = _match(check, final_text)
        return CheckResult(index, kind, ok, f"final answer {detail}", tool)
    of_tool = [c for c in calls if c.tool == tool]
    if kind == "tool_succeeded":
        if not of_tool:
            return CheckResult(index, kind, False, f"{tool} was never called", tool)
        last = of_tool[-1]
        if last.is_error:
            why = f"failed ({last.failure})" if last.failure else "returned an error result"
            return CheckResult(index, kind, False, f"the last call of {tool} ({last.call}) {why}", tool)
        return CheckResult(index, kind, True, f"{tool} succeeded ({last.call})", tool)
    # result_matches
    good = [c for c in of_tool if not c.is_error]
    if not good:
        return CheckResult(index, kind, False, f"{tool} has no successful result", tool)
    last = good[-1]
    data = blob(last.result_ref) if last.result_ref else None
    if data is None:
        return CheckResult(index, kind, False, f"the result of {last.call} is not available (payload erased)", tool)
    wire: Any = json.loads(data)
    found, value = _value_at(wire, check.pointer)
    if not found:
        return CheckResult(index, kind, False, f"{last.call}: nothing at pointer {check.pointer!r}", tool)
    ok, detail = _match(check, value)
    where = f"{last.call} at {check.pointer!r}" if check.pointer else f"{last.call} text"
    return CheckResult(index, kind, ok, f"{where} {detail}", tool)


def _match(check: DoneCheck, value: Any) -> tuple[bool, str]:
    if "equals" in check.model_fields_set:
        ok = _json_equal(value, check.equals)
        return ok, "equals the expected value" if ok else "does not equal the expected value"
    pattern = check.regex or ""
    text = value if isinstance(value, str) else canonical(value).decode("utf-8")
    ok = re.search(pattern, text[:_MAX_MATCH_CHARS]) is not None
    return ok, f"matches /{pattern}/" if ok else f"does not match /{pattern}/"


def _json_equal(a: Any, b: Any) -> bool:
    try:
        return canonical(a) == canonical(b)
    except ValueError:
        return False


def _as_dict(value: Any) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _value_at(wire: Any, pointer: str) -> tuple[bool, Any]:
    result = _as_dict(wire)
    if result is None:
        return False, None
    if pointer == "":
        return True, _text(result)
    document: Any = result.get("structuredContent")
    if document is None:
        try:
            document = json.loads(_text(result))
        except ValueError:
            return False, None
    return resolve_pointer(document, pointer)


def _text(result: Mapping[str, Any]) -> str:
    parts: list[str] = []
    content: Any = result.get("content") or []
    for item in cast(list[Any], content) if isinstance(content, list) else []:
        block = _as_dict(item)
        if block is not None and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "\n".join(parts)


def resolve_pointer(document: Any, pointer: str) -> tuple[bool, Any]:
    """RFC 6901: ``(True, value)`` at ``pointer``, or ``(False, None)`` when nothing is there."""
    if pointer == "":
        return True, document
    current: Any = document
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            mapping = cast(dict[str, Any], current)
            if part not in mapping:
                return False, None
            current = mapping[part]
        elif isinstance(current, list):
            items = cast(list[Any], current)
            if not part.isdigit() or (len(part) > 1 and part.startswith("0")) or int(part) >= len(items):
                return False, None
            current = items[int(part)]
        else:
            return False, None
    return True, current
