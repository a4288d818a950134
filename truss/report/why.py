"""Why a call was allowed, denied, held or replayed: its decision path, read from a session's entries.

``explain_call(entries, blob, call)`` walks one session's entries (a store's, or a bundle's) and
says, for the call with that id, which allowlist, pin, policy rule, approval, budget and
execution path (live, replayed on resume, cross-run memo, in-doubt resolution, signal, task)
applied, each with the seqs of the entries that record it (``Step``). ``explain_calls`` does the
same for every call of the session (the HTML report embeds it).

What is recorded is reported as recorded. Two things are not recorded and are re-derived, and
their ``Step.derived`` says so: the policy rule that *allowed* a call (only refusals and asks name
their rule), which is ``truss.policy.decide`` over the effective contract of ``session_started``
and the recorded (redacted) arguments; and the budget counts at the call, counted from the
entries in the way ``truss.budget`` charges (every call that reached an intent, and memo hits when
``budget.charge_memo_hits``). Sans-IO: entries and a blob lookup in, values out. It does not
verify anything: callers hand it entries they verified, or say they did not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from truss.contract import Contract
from truss.ledger.entry import StoredEntry
from truss.policy import Allow, Ask, Deny, decide
from truss.tools import MountedTool, split_namespaced

__all__ = ["CallExplanation", "Step", "call_ids", "explain_call", "explain_calls"]

BlobLookup = Callable[[str], bytes | None]

_SHORT = 19  # "sha256:" and 12 hex digits


@dataclass(frozen=True)
class Step:
    """One link of the decision path: ``step`` (allowlist, pin, policy, approval, budget, execution,
    outcome), a one-word ``decision``, the sentence, and the seqs of the entries that record it."""

    step: str
    decision: str
    text: str
    seqs: tuple[int, ...] = ()
    derived: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "decision": self.decision,
            "text": self.text,
            "seqs": list(self.seqs),
            "derived": self.derived,
        }


@dataclass(frozen=True)
class CallExplanation:
    """The decision path of one call of one session."""

    session: str
    call: str
    tool: str
    outcome: str
    steps: tuple[Step, ...] = field(default_factory=tuple[Step, ...])

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "call": self.call,
            "tool": self.tool,
            "outcome": self.outcome,
            "steps": [s.to_json() for s in self.steps],
        }

    def lines(self) -> list[str]:
        """The path in words, one step a line, with the entries that record it."""
        out = [f"call {self.call} of session {self.session}: {self.tool}, {self.outcome}"]
        width = max(len(s.step) for s in self.steps) if self.steps else 0
        for s in self.steps:
            where = f"  [{_seqs_text(s.seqs)}]" if s.seqs else ""
            mark = " (re-derived)" if s.derived else ""
            out.append(f"  {s.step:<{width}}  {s.text}{mark}{where}")
        if any(s.derived for s in self.steps):
            out.append(
                "  (re-derived: not itself recorded; computed from the recorded contract, arguments and entries)"
            )
        return out


def _seqs_text(seqs: Sequence[int]) -> str:
    return ("seq " if len(seqs) == 1 else "seqs ") + ", ".join(str(s) for s in seqs)


def call_ids(entries: Iterable[StoredEntry]) -> list[str]:
    """The call ids a session recorded, in order of first appearance."""
    seen: dict[str, None] = {}
    for item in entries:
        call = item.body.get("call")
        if isinstance(call, str) and item.kind != "session_suspended":
            seen.setdefault(call, None)
    return list(seen)


def explain_calls(entries: Sequence[StoredEntry], blob: BlobLookup) -> dict[str, CallExplanation]:
    """``explain_call`` for every call of the session, by call id."""
    context = _Context(entries, blob)
    return {call: context.explain(call) for call in call_ids(entries)}


def explain_call(entries: Sequence[StoredEntry], blob: BlobLookup, call: str) -> CallExplanation | None:
    """The decision path of ``call`` in one session's ``entries`` (seq order); None if it has no such call."""
    if call not in call_ids(entries):
        return None
    return _Context(entries, blob).explain(call)


# -- the walk ---------------------------------------------------------------------------------


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}  # pyright: ignore[reportUnknownVariableType]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []  # pyright: ignore[reportUnknownVariableType]


def _short(ref: Any) -> str:
    return f"{ref[:_SHORT]}…" if isinstance(ref, str) and len(ref) > _SHORT else str(ref)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class _CallEntries:
    intents: list[StoredEntry] = field(default_factory=list[StoredEntry])
    results: list[StoredEntry] = field(default_factory=list[StoredEntry])
    denials: list[StoredEntry] = field(default_factory=list[StoredEntry])
    pending: list[StoredEntry] = field(default_factory=list[StoredEntry])
    signals: list[StoredEntry] = field(default_factory=list[StoredEntry])
    asked: list[StoredEntry] = field(default_factory=list[StoredEntry])
    decided: list[StoredEntry] = field(default_factory=list[StoredEntry])
    in_doubt: list[StoredEntry] = field(default_factory=list[StoredEntry])
    resolved: list[StoredEntry] = field(default_factory=list[StoredEntry])
    suspended: list[StoredEntry] = field(default_factory=list[StoredEntry])

    @property
    def first(self) -> list[StoredEntry]:
        return sorted(
            [*self.intents, *self.results, *self.denials, *self.pending, *self.asked, *self.in_doubt],
            key=lambda e: e.seq,
        )


_BY_KIND = {
    "mcp_tool_intent": "intents",
    "mcp_tool_call": "results",
    "mcp_tool_denied": "denials",
    "mcp_tool_pending": "pending",
    "signal_received": "signals",
    "approval_requested": "asked",
    "approval_decided": "decided",
    "in_doubt": "in_doubt",
    "in_doubt_resolved": "resolved",
}


class _Context:
    def __init__(self, entries: Sequence[StoredEntry], blob: BlobLookup) -> None:
        self.entries = list(entries)
        self.blob = blob
        started = next((e for e in self.entries if e.kind == "session_started"), None)
        self.started = started
        body = started.body if started is not None else {}
        self.effective = _obj(body.get("effective"))
        self.pins = _obj(body.get("pins"))
        self.session = self.entries[0].session if self.entries else "?"
        try:
            self.contract: Contract | None = Contract.model_validate(self.effective) if self.effective else None
        except ValidationError:
            self.contract = None  # a contract this version of Truss cannot read: nothing is re-derived
        self.resumes = [e for e in self.entries if e.kind == "session_resumed"]

    # -- lookups ------------------------------------------------------------------------------

    def _of(self, call: str) -> _CallEntries:
        found = _CallEntries()
        for item in self.entries:
            if item.kind == "session_suspended":
                if call in _list(item.body.get("calls")) or call in _list(item.body.get("in_flight")):
                    found.suspended.append(item)
                continue
            if item.body.get("call") != call:
                continue
            bucket = _BY_KIND.get(item.kind)
            if bucket is not None:
                getattr(found, bucket).append(item)
        return found

    def _server(self, name: str) -> dict[str, Any] | None:
        for server in _list(_obj(self.effective.get("mcp")).get("servers")):
            if _obj(server).get("name") == name:
                return _obj(server)
        return None

    def _rule(self, index: Any) -> str:
        rules = _list(_obj(self.effective.get("policy")).get("rules"))
        if not isinstance(index, int) or not 0 <= index < len(rules):
            return f"rule {index}"
        rule = _obj(rules[index])
        conditions = _obj(rule.get("args"))
        where = f" when {', '.join(sorted(conditions))} match" if conditions else ""
        reason = rule.get("reason")
        because = f': "{reason}"' if isinstance(reason, str) and reason else ""
        return f"rule {index} ({rule.get('tool')} -> {rule.get('effect')}{where}{because})"

    def _args(self, ref: Any) -> Any:
        if not isinstance(ref, str):
            return None
        data = self.blob(ref)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    # -- the path -----------------------------------------------------------------------------

    def explain(self, call: str) -> CallExplanation:
        found = self._of(call)
        first = found.first
        tool = str(first[0].body.get("tool")) if first else "?"
        parts = split_namespaced(tool)
        server_name, tool_name = parts if parts is not None else ("?", tool)
        denial = found.denials[-1] if found.denials else None
        steps = [
            self._allowlist(tool, server_name, tool_name, denial),
            self._pin(tool, server_name, tool_name, found),
            self._policy(tool, server_name, tool_name, found, denial),
            self._approval(call, found),
            self._budget(call, tool, found, denial),
            self._execution(call, found, denial),
        ]
        outcome = self._outcome(found, denial)
        steps.append(Step("outcome", outcome.split(" ", 1)[0], outcome, self._outcome_seqs(found, denial)))
        return CallExplanation(self.session, call, tool, outcome, tuple(steps))

    def _allowlist(self, tool: str, server_name: str, tool_name: str, denial: StoredEntry | None) -> Step:
        start = (0,) if self.started is not None else ()
        if denial is not None and denial.body.get("code") == "not_mounted":
            return Step("allowlist", "refused", f"not mounted: {denial.body.get('reason')}", (*start, denial.seq))
        server = self._server(server_name)
        if server is None:
            return Step("allowlist", "refused", f"the recorded contract declares no server {server_name!r}", start)
        allow = [str(t) for t in _list(server.get("allow_tools"))]
        listed = "*" in allow or tool_name in allow
        mounted = tool in self.pins
        text = (
            f"server {server_name!r} allows {tool_name!r} (allow_tools: {', '.join(allow) or 'none'})"
            if listed
            else f"server {server_name!r} does not list {tool_name!r} in allow_tools ({', '.join(allow) or 'none'})"
        )
        if listed:
            text += "; it was mounted when the session started" if mounted else "; it was not mounted"
        return Step("allowlist", "allowed" if listed and mounted else "refused", text, start)

    def _pin(self, tool: str, server_name: str, tool_name: str, found: _CallEntries) -> Step:
        start_pin = self.pins.get(tool)
        declared: Any = None
        for settings in _list(_obj(self._server(server_name)).get("tools")):
            if _obj(settings).get("name") == tool_name:
                declared = _obj(settings).get("pin")
        used = [e for e in [*found.intents, *found.results] if "pin" in e.body]
        failed = [e for e in found.results if _obj(e.body.get("failure")).get("cause") == "pin_changed"]
        seqs = tuple(sorted({0, *(e.seq for e in used)})) if self.started is not None else ()
        if failed:
            return Step(
                "pin",
                "changed",
                "the tool's definition changed during the run, so the call was refused (pin_changed)",
                (*seqs, failed[-1].seq),
            )
        if not isinstance(start_pin, str):
            return Step("pin", "none", "no pin was recorded for this tool (it was not mounted)", seqs)
        text = f"definition hash {_short(start_pin)} recorded when the tools were mounted"
        if isinstance(declared, str):
            text += ", and the contract declares it, so a different definition would have stopped the run"
        others = sorted({str(e.body.get("pin")) for e in used} - {start_pin})
        if others:
            return Step("pin", "differs", text + f"; the call recorded another pin, {_short(others[0])}", seqs)
        if used:
            text += "; the call ran under the same pin"
        return Step("pin", "matched" if used else "recorded", text, seqs)

    def _policy(
        self, tool: str, server_name: str, tool_name: str, found: _CallEntries, denial: StoredEntry | None
    ) -> Step:
        if denial is not None:
            code = denial.body.get("code")
            reason = denial.body.get("reason")
            if code == "rule":
                return Step("policy", "denied", f"denied by {self._rule(denial.body.get('rule'))}", (denial.seq,))
            if code in ("default", "readonly_only", "not_mounted", "bad_arguments", "missing_argument"):
                return Step("policy", "denied", f"denied ({code}): {reason}", (denial.seq,))
        if found.asked:
            asked = found.asked[0]
            return Step(
                "policy",
                "ask",
                f"{self._rule(asked.body.get('rule'))} requires a person's approval",
                (asked.seq,),
            )
        source = (found.intents or found.results or found.pending or [None])[0]
        if source is None:
            return Step("policy", "unknown", "the session recorded nothing the policy decided for this call")
        return self._derived_policy(tool, server_name, tool_name, source, denial)

    def _derived_policy(
        self, tool: str, server_name: str, tool_name: str, source: StoredEntry, denial: StoredEntry | None
    ) -> Step:
        seqs = (0, source.seq)
        if self.contract is None:
            return Step("policy", "allowed", "allowed (the recorded contract cannot be re-read to say by which rule)")
        args = self._args(source.body.get("args"))
        if not isinstance(args, dict):
            return Step(
                "policy",
                "allowed",
                "allowed; the arguments are not held (erased or not exported), so the rule is not re-derived",
                seqs,
            )
        # Allowed calls record no rule. The readonly_only step cannot be replayed (annotations are not
        # recorded), but a call the gate let through under readonly_only declared readOnlyHint: true.
        mounted = {tool: MountedTool(server_name, tool_name, {"annotations": {"readOnlyHint": True}}, "")}
        typed_args: dict[str, Any] = args  # pyright: ignore[reportUnknownVariableType]
        decision = decide(self.contract, tool, typed_args, mounted)
        caveat = ""
        if _list(_obj(self._server(server_name)).get("secret_args")):
            caveat = " (secret arguments are recorded redacted, so a rule on them is checked on the redacted value)"
        if self.contract.policy.readonly_only:
            caveat += "; policy.readonly_only is set and the server declared the tool read-only"
        if isinstance(decision, Allow):
            by = (
                f"allowed by {self._rule(decision.rule)}"
                if decision.rule is not None
                else f"allowed by the default (policy.default = {self.contract.policy.default}): no rule matched"
            )
            return Step("policy", "allowed", by + caveat, seqs, derived=True)
        said = f"ask ({self._rule(decision.rule)})" if isinstance(decision, Ask) else self._deny_text(decision)
        budget_denied = denial is not None and denial.body.get("code") == "budget"
        what = "refused by the budget" if budget_denied else "let through"
        return Step(
            "policy",
            "mismatch",
            f"the call was {what}, but re-deriving the policy from the recorded contract gives {said}{caveat}",
            seqs,
            derived=True,
        )

    def _deny_text(self, decision: Deny) -> str:
        if decision.code == "rule":
            return f"deny ({self._rule(decision.rule)})"
        return f"deny ({decision.code}: {decision.reason})"

    def _approval(self, call: str, found: _CallEntries) -> Step:
        if not found.asked:
            return Step("approval", "not needed", "no approval was needed: no ask rule matched")
        asked = found.asked[0]
        if not found.decided:
            return Step(
                "approval",
                "waiting",
                f"requested at seq {asked.seq} and not decided yet: `truss approve {self.session} {call}` "
                "(or --deny), then `truss resume`",
                (asked.seq,),
            )
        decided = found.decided[-1]
        approved = decided.body.get("approved") is True
        by = decided.body.get("by")
        reason = decided.body.get("reason")
        text = f"{'approved' if approved else 'refused'} with `truss approve`"
        if isinstance(by, str) and by:
            text += f" by {by}"
        if isinstance(reason, str) and reason:
            text += f': "{reason}"'
        return Step("approval", "approved" if approved else "refused", text, (asked.seq, decided.seq))

    def _charges(self) -> list[tuple[str, str, StoredEntry]]:
        """(call, tool, entry) for every charged call, in the order the budget charged them."""
        memo_charged = True
        if self.contract is not None:
            memo_charged = self.contract.budget.charge_memo_hits
        seen: set[str] = set()
        out: list[tuple[str, str, StoredEntry]] = []
        for item in self.entries:
            call = item.body.get("call")
            if not isinstance(call, str) or call in seen:
                continue
            memo = item.kind == "mcp_tool_call" and "replayed_from" in item.body
            if item.kind == "mcp_tool_intent" or (memo and memo_charged):
                seen.add(call)
                out.append((call, str(item.body.get("tool")), item))
        return out

    def _budget(self, call: str, tool: str, found: _CallEntries, denial: StoredEntry | None) -> Step:
        server_name, tool_name = split_namespaced(tool) or ("?", tool)
        if denial is not None and denial.body.get("code") == "budget":
            return Step(
                "budget",
                "exceeded",
                f"refused: limit {denial.body.get('limit')}: {denial.body.get('reason')}",
                (denial.seq,),
            )
        if denial is not None:
            return Step("budget", "not charged", "not charged: the call was refused before the budget was consulted")
        charges = self._charges()
        position = next((i for i, (c, _, _) in enumerate(charges) if c == call), None)
        if position is None:
            memo = any("replayed_from" in e.body for e in found.results)
            if memo:
                return Step("budget", "not charged", "not charged: budget.charge_memo_hits is false")
            if found.asked:
                return Step("budget", "not charged", "not charged yet: a call is charged when it runs")
            return Step("budget", "not charged", "not charged: the call never ran")
        before = charges[: position + 1]
        run_count = len(before)
        server_count = sum(1 for _, t, _ in before if (split_namespaced(t) or ("", ""))[0] == server_name)
        tool_count = sum(1 for _, t, _ in before if t == tool)
        entry = charges[position][2]
        limits = self._limits(server_name, tool_name)
        parts = [f"call {run_count} of max_tool_calls {limits[0]}"]
        parts.append(
            f"server {server_name!r}: {server_count} of budget_calls {limits[1]}"
            if limits[1] is not None
            else f"server {server_name!r}: {_plural(server_count, 'call')} (no budget_calls)"
        )
        parts.append(
            f"{tool}: {tool_count} of budget_calls {limits[2]}"
            if limits[2] is not None
            else f"{tool}: {_plural(tool_count, 'call')} (no budget_calls)"
        )
        return Step("budget", "charged", "charged before the call: " + "; ".join(parts), (entry.seq,), derived=True)

    def _tool_setting(self, tool: str, name: str) -> Any:
        parts = split_namespaced(tool)
        if parts is None:
            return None
        for settings in _list(_obj(self._server(parts[0])).get("tools")):
            if _obj(settings).get("name") == parts[1]:
                return _obj(settings).get(name)
        return None

    def _limits(self, server_name: str, tool_name: str) -> tuple[Any, Any, Any]:
        run = _obj(self.effective.get("budget")).get("max_tool_calls")
        server = self._server(server_name) or {}
        return run, server.get("budget_calls"), self._tool_setting(f"mcp:{server_name}:{tool_name}", "budget_calls")

    def _execution(self, call: str, found: _CallEntries, denial: StoredEntry | None) -> Step:
        if denial is not None:
            return Step("execution", "not called", "not called: the server never saw this call", (denial.seq,))
        final = found.results[-1] if found.results else None
        replays = [r.seq for r in self.resumes if final is not None and r.seq > final.seq]
        replayed = (
            f"; on resume (seq {', '.join(map(str, replays))}) the recorded result was returned from the ledger, "
            "not requested again"
            if replays
            else ""
        )
        if final is not None and "replayed_from" in final.body:
            origin = _obj(final.body.get("replayed_from"))
            ttl = self._tool_setting(str(final.body.get("tool")), "memo")
            within = f" (memo = {ttl!r} for this tool)" if isinstance(ttl, str) else ""
            return Step(
                "execution",
                "memo",
                f"answered from the cross-run memo{within}: the result that session {origin.get('session')} "
                f"recorded at seq {origin.get('seq')} (entry {_short(origin.get('hash'))}); the server was not called"
                + replayed,
                (final.seq,),
            )
        if found.in_doubt:
            doubt = found.in_doubt[-1]
            seqs = [*(e.seq for e in found.intents), doubt.seq]
            if not found.resolved:
                return Step(
                    "execution",
                    "in doubt",
                    f"in doubt: the run stopped after the intent and before a result; waiting for "
                    f"`truss resolve {self.session} {call}`",
                    tuple(seqs),
                )
            resolution = found.resolved[-1]
            seqs.append(resolution.seq)
            if final is not None:
                seqs.append(final.seq)
            how = resolution.body.get("resolution")
            answer = {
                "result": "gave the result (--result), which became the recorded result",
                "failed": "said it failed (--failed), which became the recorded result",
                "not_sent": "said it never reached the server (--not-sent), so it was sent again on resume",
            }.get(str(how), f"answered {how!r}")
            return Step(
                "execution",
                "resolved",
                f"in doubt after a crash (an intent without a result); the operator, with `truss resolve`, {answer}"
                + replayed,
                tuple(sorted(set(seqs))),
            )
        if found.pending:
            pending = found.pending[-1]
            kind = pending.body.get("kind")
            seqs = [*(e.seq for e in found.intents), pending.seq, *(e.seq for e in found.signals)]
            if final is not None:
                seqs.append(final.seq)
            if kind == "signal":
                name = pending.body.get("signal")
                delivered = (
                    f"; `truss signal` delivered {name!r} and its payload became the result"
                    if found.signals
                    else f"; waiting for `truss signal {self.session} {name}`"
                )
                text = f"the server answered that the work is pending (signal {name!r}){delivered}"
            else:
                text = f"the server runs it as MCP task {pending.body.get('task')!r}"
                text += "; its result was recorded when the task finished" if final is not None else "; still running"
            return Step("execution", "pending" if final is None else "async", text + replayed, tuple(sorted(set(seqs))))
        if found.intents and final is None:
            return Step(
                "execution",
                "sent",
                "the intent was recorded and no result yet (the run stopped while the call was in flight)",
                tuple(e.seq for e in found.intents),
            )
        if final is None:
            if found.asked:
                return Step("execution", "not called", "not called yet: waiting for the approval")
            return Step("execution", "not called", "not called")
        seqs = (*(e.seq for e in found.intents), final.seq)
        again = (
            f"; sent {len(found.intents)} times (the tool is declared safe to re-send after a crash)"
            if len(found.intents) > 1
            else ""
        )
        leg = sum(1 for r in self.resumes if r.seq < final.seq)
        during = f" in leg {leg + 1} of the run (after the resume at seq {self.resumes[leg - 1].seq})" if leg else ""
        duration = final.body.get("duration_ms")
        took = f", {duration} ms" if isinstance(duration, int) else ""
        return Step("execution", "live", f"called live{during}{took}{again}" + replayed, seqs)

    def _outcome(self, found: _CallEntries, denial: StoredEntry | None) -> str:
        if denial is not None:
            return f"denied ({denial.body.get('code')}): {denial.body.get('reason')}"
        if found.results:
            final = found.results[-1]
            failure = _obj(final.body.get("failure"))
            if failure:
                return f"failed ({failure.get('cause')})"
            return "tool error (the tool answered isError)" if final.body.get("is_error") else "ok"
        if found.asked:
            return "waiting for approval" if not found.decided else "approved, not run yet"
        if found.in_doubt:
            return "in doubt"
        if found.pending:
            return "pending"
        if found.intents:
            return "sent, no result recorded"
        return "unknown"

    def _outcome_seqs(self, found: _CallEntries, denial: StoredEntry | None) -> tuple[int, ...]:
        if denial is not None:
            return (denial.seq,)
        for group in (found.results, found.decided, found.asked, found.in_doubt, found.pending, found.intents):
            if group:
                return (group[-1].seq,)
        return ()
