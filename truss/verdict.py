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
``evaluate`` reads the whole record; ``VerdictFold`` reaches the same verdict entry by entry, as
the run appends them (the journal feeds it, a resumed run's recorded entries first), holding for
each check what its kind's ``CheckFold`` needs and, for the rules above, the first denial, the
first budget denial, the first call that failed below the tool and whether a call succeeded. A
contract with a check whose kind has no fold (the panel) is folded by keeping the entries and
evaluating them whole at the end. This module is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from truss._errors import TrussError
from truss._pointer import resolve_pointer
from truss._registry import Registry
from truss.contract import DONE_CHECKS, CallRecord, Checked, CheckFold, CheckKind, Contract, DoneCheck, Evidence

__all__ = ["CheckResult", "RunError", "Verdict", "VerdictFold", "default_problem", "evaluate", "resolve_pointer"]

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
            calls.append(_call_record(body))
        elif entry.kind == "mcp_tool_denied":
            denials.append(str(body.get("tool")))
            if first_denied is None:
                first_denied = (str(body.get("call")), str(body.get("tool")))
            if body.get("code") == "budget" and budget_denial is None:
                budget_denial = _budget_denial(body)
    evidence = Evidence(calls=tuple(calls), denials=tuple(denials), final_text=final_text, blob=blob,
                        entries=tuple(entries))  # fmt: skip
    registry = kinds or DONE_CHECKS
    checks = [_check(i, c, registry, evidence) for i, c in enumerate(contract.done.checks)]
    default: str | None = None
    if not contract.done.checks and not contract.done.pass_without_checks:
        default = default_problem(calls, first_denied)
    broken = next((c for c in calls if c.failure in _BELOW_TOOL), None)
    return _verdict(checks, default, broken, budget_denial, error)


class VerdictFold:
    """The verdict of a session folded entry by entry: ``add`` each entry in seq order (anything with
    ``kind`` and ``body``), then ``verdict``; the same verdict ``evaluate`` gives over those entries.

    ``blob`` reads payloads (a ``result_matches`` check with ``select`` any or all matches each
    result as its entry comes: the payload is stored with it). ``folds_all``: every check folds
    (else the entries are kept and evaluated whole at the end).
    """

    def __init__(
        self, contract: Contract, blob: Callable[[str], bytes | None], *, kinds: Registry[CheckKind] | None = None
    ) -> None:
        self.contract = contract
        self.blob = blob
        self.kinds = kinds or DONE_CHECKS
        self._folds: list[CheckFold | None] = []
        for check in contract.done.checks:
            kind = self.kinds.get(check.kind)
            self._folds.append(kind.fold(check, blob) if kind is not None and kind.fold is not None else None)
        self.folds_all = all(
            fold is not None or self.kinds.get(check.kind) is None
            for fold, check in zip(self._folds, contract.done.checks, strict=True)
        )
        self._entries: list[Any] | None = None if self.folds_all else []
        self._first_ok: CallRecord | None = None
        self._first_denied: tuple[str, str] | None = None
        self._budget_denial: tuple[str, str, str | None] | None = None
        self._broken: CallRecord | None = None
        self._raised: dict[int, Exception] = {}  # a fold that raised while folding: its check fails so

    def add(self, entry: Any) -> None:
        if self._entries is not None:
            self._entries.append(entry)
            return
        kind = entry.kind
        if kind not in ("mcp_tool_call", "mcp_tool_denied"):
            return
        body: Mapping[str, Any] = entry.body
        if kind == "mcp_tool_call":
            if not self._folds and self._first_ok is not None:
                # No check folds calls, and the first good call is known: only a failure below the tool
                # still counts (every result of a long run passes here, a resumed one's recorded first).
                if self._broken is None:
                    failure = _as_dict(body.get("failure"))
                    if failure is not None and str(failure.get("cause")) in _BELOW_TOOL:
                        self._broken = _call_record(body)
                return
            call = _call_record(body)
            if self._first_ok is None and not call.is_error:
                self._first_ok = call
            if self._broken is None and call.failure in _BELOW_TOOL:
                self._broken = call
            self._each(lambda fold: fold.call(call))
            return
        tool = str(body.get("tool"))
        if self._first_denied is None:
            self._first_denied = (str(body.get("call")), tool)
        if body.get("code") == "budget" and self._budget_denial is None:
            self._budget_denial = _budget_denial(body)
        self._each(lambda fold: fold.denial(tool))

    def _each(self, step: Callable[[CheckFold], None]) -> None:
        for index, fold in enumerate(self._folds):
            if fold is None or index in self._raised:
                continue
            try:
                step(fold)
            except Exception as exc:  # re-raised by verdict(), as evaluate() meets it
                self._raised[index] = exc

    def verdict(self, *, final_text: str | None, error: RunError | None = None) -> Verdict:
        if self._entries is not None:
            return evaluate(self.contract, self._entries, self.blob, final_text=final_text, error=error,
                            kinds=self.kinds)  # fmt: skip
        checks: list[CheckResult] = []
        for index, (check, fold) in enumerate(zip(self.contract.done.checks, self._folds, strict=True)):
            kind = self.kinds.get(check.kind)
            if fold is None or kind is None:
                checks.append(_unknown(index, check))
                continue
            raised = self._raised.get(index)

            def checked(fold: CheckFold = fold, raised: Exception | None = raised) -> Checked:
                if raised is not None:
                    raise raised
                return fold.checked(final_text)

            checks.append(_checked(index, check, checked))
        default: str | None = None
        if not self.contract.done.checks and not self.contract.done.pass_without_checks:
            default = default_problem([self._first_ok] if self._first_ok else [], self._first_denied)
        return _verdict(checks, default, self._broken, self._budget_denial, error)


def _call_record(body: Mapping[str, Any]) -> CallRecord:
    failure = _as_dict(body.get("failure"))
    return CallRecord(
        tool=str(body.get("tool")),
        call=str(body.get("call")),
        is_error=body.get("is_error") is True,
        result_ref=body.get("result") if isinstance(body.get("result"), str) else None,
        failure=str(failure.get("cause")) if failure is not None else None,
    )


def _budget_denial(body: Mapping[str, Any]) -> tuple[str, str, str | None]:
    limit = body.get("limit")
    return (str(body.get("call")), str(body.get("reason")), str(limit) if limit else None)


def _verdict(
    checks: list[CheckResult],
    default: str | None,
    broken: CallRecord | None,
    budget_denial: tuple[str, str, str | None] | None,
    error: RunError | None,
) -> Verdict:
    """The status from the checks' results and the run's facts (the module docstring's rules)."""
    failed_check = next((c for c in checks if not c.ok), None)
    failed: str | None = default  # what failed, as "check N (kind) failed: why"
    if failed_check is not None:
        failed = f"check {failed_check.index} ({failed_check.kind}) failed: {failed_check.detail}"
    if error is not None:
        return Verdict("error", checks, f"the run could not finish: {error.detail}", error)
    undecided = next((c for c in checks if not c.ok and c.cause), None)
    if undecided is not None and undecided.cause is not None:
        detail = f"check {undecided.index} ({undecided.kind}) could not be decided: {undecided.detail}"
        return Verdict("error", checks, f"the run could not finish: {detail}", RunError(undecided.cause, detail))
    if failed is not None:
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
        return _unknown(index, check)
    return _checked(index, check, lambda: kind.evaluate(check, replace(evidence, check_index=index)))


def _unknown(index: int, check: DoneCheck) -> CheckResult:
    detail = f"done-check kind {check.kind!r} has no evaluation here"
    return CheckResult(index, check.kind, False, detail, check.tool)


def _checked(index: int, check: DoneCheck, evaluation: Callable[[], Checked]) -> CheckResult:
    try:
        checked = evaluation()
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
