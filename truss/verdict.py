"""Done checks -> the verdict of a run: ``pass``, ``fail`` (which check, why) or ``error`` (which cause).

The verdict is computed from the session's recorded entries and payloads, not from live state, so
that an auditor replaying a finished session from its ledger reaches the same verdict
(``evaluate`` takes entries and a blob reader). The entries become ``Evidence`` (the calls, the
denials, the final answer) and each ``[[done.checks]]`` is evaluated by its kind, looked up by
name in a registry of ``CheckKind`` (``truss.contract.checks``, which also says what each built-in
kind checks). A kind that is not in the registry is refused when the contract loads; should one
reach this module all the same (a recorded contract evaluated with another registry), its check
fails, naming the kind: a check never passes without its own evaluation. A kind whose evaluation
raises fails its check the same way.

Status: ``error`` when the run could not finish (a budget or the deadline stopped it, the provider
failed) or when a check failed and a call had failed *below* the tool (a server crashed, timed out
or broke the protocol) or had been refused for budget: then the work could not be done, which is
not the same as done wrong. A check whose kind says it could not be *decided* (``Checked.cause``:
a reviewer panel whose reviewers could not answer) makes the verdict ``error`` with that cause too.
Otherwise ``pass`` when every check holds and ``fail`` naming the first that does not. The checks
are evaluated and reported in every case.

A contract without done checks does not pass whatever happened: its run passes only when at least
one call succeeded and no call was denied (``default_problem``); otherwise it fails (or is
``error``, by the rules above, when a call failed below the tool or a budget refused one). A
contract says ``[done] pass_without_checks = true`` to pass such a run whatever its calls did.
This module is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from truss._errors import TrussError
from truss._pointer import resolve_pointer
from truss._registry import Registry
from truss.contract import DONE_CHECKS, CallRecord, CheckKind, Contract, DoneCheck, Evidence

__all__ = ["CheckResult", "RunError", "Verdict", "default_problem", "evaluate", "resolve_pointer"]

Status = Literal["pass", "fail", "error"]
_BELOW_TOOL = {"timeout", "connection_closed", "server_error", "protocol_error", "transport", "invalid_result",
               "pin_changed"}  # fmt: skip


@dataclass(frozen=True)
class RunError:
    """Why a run could not finish: ``cause`` is ``budget``, ``deadline``, ``provider``, ``server``, ``input``
    or ``panel`` (a reviewer panel could not decide)."""

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
    extra: Mapping[str, Any] | None = None  # the kind's own members (a panel's ``panel``)
    cause: str | None = None  # a failure that means "could not be decided" (``Checked.cause``)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "kind": self.kind, "ok": self.ok, "detail": self.detail}
        if self.tool is not None:
            out["tool"] = self.tool
        for key, value in (self.extra or {}).items():
            out.setdefault(key, value)
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


def evaluate(
    contract: Contract,
    entries: Iterable[Any],
    blob: Callable[[str], bytes | None],
    *,
    final_text: str | None,
    error: RunError | None = None,
    kinds: Registry[CheckKind] | None = None,
) -> Verdict:
    """The verdict of a session from its entries (anything with ``kind`` and ``body``) and payloads.

    ``kinds``: the registry each check's kind is looked up in (default ``DONE_CHECKS``).
    """
    calls: list[CallRecord] = []
    denials: list[str] = []
    first_denied: tuple[str, str] | None = None  # call, tool
    budget_denial: tuple[str, str, str | None] | None = None  # call, reason, limit of the first
    entries = list(entries)
    for entry in entries:
        body: Mapping[str, Any] = entry.body
        if entry.kind == "mcp_tool_call":
            failure = _as_dict(body.get("failure"))
            calls.append(
                CallRecord(
                    tool=str(body.get("tool")),
                    call=str(body.get("call")),
                    is_error=body.get("is_error") is True,
                    result_ref=body.get("result") if isinstance(body.get("result"), str) else None,
                    failure=str(failure.get("cause")) if failure is not None else None,
                )
            )
        elif entry.kind == "mcp_tool_denied":
            denials.append(str(body.get("tool")))
            if first_denied is None:
                first_denied = (str(body.get("call")), str(body.get("tool")))
            if body.get("code") == "budget" and budget_denial is None:
                limit = body.get("limit")
                budget_denial = (str(body.get("call")), str(body.get("reason")), str(limit) if limit else None)
    evidence = Evidence(calls=tuple(calls), denials=tuple(denials), final_text=final_text, blob=blob,
                        entries=tuple(entries))  # fmt: skip
    registry = kinds or DONE_CHECKS
    checks = [_check(i, c, registry, evidence) for i, c in enumerate(contract.done.checks)]
    failed_check = next((c for c in checks if not c.ok), None)
    failed: str | None = None  # what failed, as "check N (kind) failed: why"
    if failed_check is not None:
        failed = f"check {failed_check.index} ({failed_check.kind}) failed: {failed_check.detail}"
    elif not contract.done.checks and not contract.done.pass_without_checks:
        failed = default_problem(calls, first_denied)
    if error is not None:
        return Verdict("error", checks, f"the run could not finish: {error.detail}", error)
    undecided = next((c for c in checks if not c.ok and c.cause), None)
    if undecided is not None and undecided.cause is not None:
        detail = f"check {undecided.index} ({undecided.kind}) could not be decided: {undecided.detail}"
        return Verdict("error", checks, f"the run could not finish: {detail}", RunError(undecided.cause, detail))
    if failed is not None:
        broken = next((c for c in calls if c.failure in _BELOW_TOOL), None)
        if broken is not None:
            server = broken.tool.split(":")[1] if broken.tool.count(":") >= 2 else broken.tool
            detail = f"call {broken.call} ({broken.tool}) failed below the tool ({broken.failure})"
            return Verdict(
                "error",
                checks,
                f"the run could not finish: {detail}; then {failed}",
                RunError("server", f"server {server!r}: {detail}"),
            )
        if budget_denial is not None:
            call, reason, limit = budget_denial
            detail = f"call {call} was refused: {reason}"
            return Verdict(
                "error",
                checks,
                f"the run could not finish: {detail}; then {failed}",
                RunError("budget", detail, limit),
            )
        return Verdict("fail", checks, failed)
    return Verdict("pass", checks, None)


def default_problem(calls: Iterable[CallRecord], first_denied: tuple[str, str] | None) -> str | None:
    """Why a run of a contract without done checks does not pass, or None when it does.

    It passes when at least one call succeeded (a result without ``isError``) and none was denied.
    """
    if first_denied is not None:
        call, tool = first_denied
        return f"the contract has no done checks, and call {call} ({tool}) was denied"
    if not any(not c.is_error for c in calls):
        return "the contract has no done checks, and no call succeeded"
    return None


def _check(index: int, check: DoneCheck, kinds: Registry[CheckKind], evidence: Evidence) -> CheckResult:
    kind = kinds.get(check.kind)
    if kind is None:
        detail = f"done-check kind {check.kind!r} has no evaluation here"
        return CheckResult(index, check.kind, False, detail, check.tool)
    try:
        checked = kind.evaluate(check, replace(evidence, check_index=index))
    except TrussError:
        raise  # the record could not be read (a store error): not the check's answer
    except Exception as exc:
        # A kind's own bug fails its check rather than leaving the session without a verdict.
        return CheckResult(index, check.kind, False, f"the evaluation raised {type(exc).__name__}", check.tool)
    extra = {k: v for k, v in (checked.extra or {}).items() if k not in _OWN_MEMBERS} or None
    return CheckResult(index, check.kind, checked.ok, checked.detail, check.tool, extra, checked.cause)


_OWN_MEMBERS = frozenset({"index", "kind", "ok", "detail", "tool"})


def _as_dict(value: Any) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None
