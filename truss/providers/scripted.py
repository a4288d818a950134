"""The scripted provider: plays ``[[agent.steps]]`` one tool call per turn, offline and deterministic.

Each turn looks at the conversation in the ``TurnRequest``: the calls it made carry the ids
``step-0``, ``step-1``, ... and the loop answers each with a ``tool`` message of the same
``call_id``. The next turn calls the step after the highest one already called; after the last
step it answers with ``agent.final`` (or a short summary) and no tool calls. The response is a
function of the request and the contract only, so a replayed run asks for, and gets, the same.

Step arguments may refer to earlier results (steps count from 0):

- ``${steps.N.result}``: the text of step N's result;
- ``${steps.N.result/a/0/b}``: an RFC 6901 pointer (``truss._pointer``, the one resolver done
  checks use too) into step N's ``structuredContent`` (or, when the server sent none, into its
  text parsed as JSON);
- ``${steps.N.is_error}``: whether step N's result was an error (a denial is one).

A string that is exactly one reference takes the referenced JSON value with its type; a reference
inside a longer string is replaced by its text (strings as they are, anything else as compact
JSON). Substituted values are never scanned again, so a tool result cannot smuggle in a reference
of its own (``${env.X}`` in a result stays text). A reference to a step that failed, has not run
or does not exist, or a pointer that finds nothing, ends the plan with a text saying so and no
tool call: the run finishes and its done checks decide the verdict. ``agent.final`` may use the
same references.

``${params.X}`` and ``${env.X}`` in arguments are filled in by ``truss.contract.render_arguments``
(the contract's parameter values, the environment given to ``make_provider``) in the same single
pass, one reference at a time, so a parameter's value is never read as a reference either. Every
step is rendered once when the provider is built, so a missing parameter or variable is an
``InputError`` before the run starts, never half-way through it. This module does no I/O.

Cost per turn: the loop only ever appends to the conversation, so the provider keeps what it read
of the previous request (the highest step called, the outcomes later steps or ``agent.final``
refer to, which steps failed) and reads only the messages added since. The loop sends it only
those (``reads_new_messages``; ``TurnRequest.first`` is where they start in the conversation),
and keeps no conversation of its own. A request that holds the whole conversation (``first`` 0)
is read the same way: the earlier reading is taken when the request holds, at the place where the
last one ended, the very message object that reading ended with, and otherwise the request is read
from its start. Either way the answer is the one a reading of the whole conversation gives. A
request that starts after what was read (a gap) cannot be answered and is a ``ProviderError``.
Only the outcomes of steps that some reference names are kept, so memory stays flat over a long
plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from truss._errors import InputError, ProviderError
from truss._pointer import resolve_pointer
from truss.contract import Contract, Step, render_arguments
from truss.contract.providers import SCRIPTED
from truss.ledger.canonical import canonical
from truss.providers._http import as_list, as_object
from truss.providers.base import ToolCall, TurnRequest, TurnResponse
from truss.tools import provider_name, split_namespaced

__all__ = ["ScriptedProvider", "resolve_pointer"]

_ANY_REF = re.compile(r"\$\{([^{}]*)\}")
_STEP_REF = re.compile(r"steps\.([0-9]{1,6})\.(result(?:/[^{}]*)?|is_error)")
_CALL_ID = re.compile(r"^step-([0-9]{1,6})\Z")


@dataclass(frozen=True)
class _Outcome:
    is_error: bool
    text: str
    structured: Any
    has_structured: bool


class _BrokenReference(Exception):
    def __init__(self, reference: str, why: str) -> None:
        super().__init__(why)
        self.reference = reference
        self.why = why


class _Reading:
    """What the conversation said so far: the highest step called, the outcomes that are referred to,
    the steps that failed, and where the reading stopped (``read`` messages, ending with ``last``)."""

    def __init__(self, needed: frozenset[int]) -> None:
        self.needed = needed
        self.called: int | None = None
        self.outcomes: dict[int, _Outcome] = {}
        self.failed: set[int] = set()
        self.read = 0
        self.last: dict[str, Any] | None = None

    def continues(self, messages: list[dict[str, Any]], first: int) -> bool:
        if first > self.read:
            return False
        if first == self.read:
            return True
        at = self.read - 1 - first
        return len(messages) > at and messages[at] is self.last

    def take(self, messages: list[dict[str, Any]], first: int) -> None:
        for message in messages[self.read - first :]:
            self._one(message)
        self.read = first + len(messages)
        self.last = messages[-1] if messages else self.last

    def _one(self, message: dict[str, Any]) -> None:
        role = message.get("role")
        if role == "assistant":
            for raw in as_list(message.get("tool_calls")) or []:
                call = as_object(raw)
                index = _step_index(call.get("id") if call else None)
                if index is not None:
                    self.called = index if self.called is None else max(self.called, index)
        elif role == "tool":
            index = _step_index(message.get("call_id"))
            if index is None:
                return
            is_error = message.get("is_error") is True
            if is_error:
                self.failed.add(index)
            else:
                self.failed.discard(index)
            if index in self.needed:
                text = message.get("text")
                self.outcomes[index] = _Outcome(
                    is_error=is_error,
                    text=text if isinstance(text, str) else "",
                    structured=message.get("structured"),
                    has_structured="structured" in message and message.get("structured") is not None,
                )


def _referenced_steps(value: Any) -> set[int]:
    """The step numbers the references in ``value`` (a step's arguments, ``agent.final``) name."""
    if isinstance(value, str):
        return {
            int(step.group(1))
            for ref in _ANY_REF.finditer(value)
            if (step := _STEP_REF.fullmatch(ref.group(1))) is not None
        }
    found: set[int] = set()
    for item in as_list(value) or (as_object(value) or {}).values():
        found |= _referenced_steps(item)
    return found


class ScriptedProvider:
    """Plays the contract's steps; ``environ`` fills ``${env.X}`` in their arguments."""

    name = "scripted"
    capabilities = SCRIPTED.capabilities

    def __init__(self, contract: Contract, *, environ: Mapping[str, str]) -> None:
        self._steps: list[Step] = list(contract.agent.steps)
        self._final = contract.agent.final
        params: dict[str, Any] = dict(contract.param_values)

        def fill(reference: str) -> Any:
            return render_arguments({"value": reference}, params=params, environ=environ)["value"]

        self._fill: Callable[[str], Any] = fill
        needed: set[int] = _referenced_steps(self._final) if self._final is not None else set()
        for step in self._steps:
            needed |= _referenced_steps(dict(step.arguments))
        self._needed = frozenset(needed)
        self._reading = _Reading(self._needed)
        self._names: dict[str, str] = {}  # namespaced tool -> its provider name
        for index, step in enumerate(self._steps):
            try:
                render_arguments(step.arguments, params=params, environ=environ)
            except InputError as err:
                fields = {k: v for k, v in err.fields.items() if k != "step"}
                raise InputError(
                    f"agent.steps[{index}] ({step.tool}): {err.message}", remedy=err.remedy, step=index, **fields
                ) from None

    def __repr__(self) -> str:
        return f"ScriptedProvider(steps={len(self._steps)})"

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        return self.respond(request)

    async def aclose(self) -> None:
        return None

    def respond(self, request: TurnRequest) -> TurnResponse:
        """The next turn for ``request`` (the synchronous core of ``next_turn``)."""
        reading = self._reading
        if not reading.continues(request.messages, request.first):
            if request.first:
                raise ProviderError(
                    f"the scripted provider read {reading.read} message(s) of the conversation, and turn "
                    f"{request.turn}'s request starts at message {request.first}",
                    remedy="Send the scripted provider every message of the conversation, in order",
                    provider=self.name,
                )
            reading = self._reading = _Reading(self._needed)
        reading.take(request.messages, request.first)
        called, outcomes = reading.called, reading.outcomes
        index = called + 1 if called is not None else 0
        if index >= len(self._steps):
            return self._finish(reading)
        step = self._steps[index]
        name = self._names.get(step.tool)
        if name is None:
            split = split_namespaced(step.tool)
            if split is None:  # the contract model already refuses this; kept so the plan ends, not crashes
                return _stop(f"Scripted plan stopped at step {index}: {step.tool!r} is not a namespaced tool name.")
            name = self._names[step.tool] = provider_name(*split)  # a long plan names few tools
        try:
            arguments = _substitute(dict(step.arguments), outcomes, index, self._fill)
        except _BrokenReference as broken:
            return _stop(
                f"Scripted plan stopped at step {index} ({step.tool}): {broken.reference} {broken.why}, "
                f"so the step was not called."
            )
        call = ToolCall(id=f"step-{index}", name=name, arguments=arguments)
        return TurnResponse(text="", tool_calls=[call], stop_reason="tool_use")

    def _finish(self, reading: _Reading) -> TurnResponse:
        outcomes = reading.outcomes
        if self._final is None:
            failed = sorted(reading.failed)
            text = f"Scripted plan complete: {len(self._steps)} step(s) played"
            text += f"; step(s) {', '.join(map(str, failed))} returned an error." if failed else "."
            return _stop(text)
        try:
            text = _substitute(self._final, outcomes, len(self._steps), None)
        except _BrokenReference as broken:
            return _stop(f"Scripted plan could not write its final answer: {broken.reference} {broken.why}.")
        return _stop(_as_text(text))


def _stop(text: str) -> TurnResponse:
    return TurnResponse(text=text, tool_calls=[], stop_reason="end_turn")


def _step_index(call_id: Any) -> int | None:
    if not isinstance(call_id, str):
        return None
    match = _CALL_ID.match(call_id)
    return int(match.group(1)) if match else None


def _substitute(value: Any, outcomes: Mapping[int, _Outcome], current: int, fill: Callable[[str], Any] | None) -> Any:
    """``value`` with every reference replaced, in strings inside lists and objects too.

    Step references are resolved here; ``${params.X}``/``${env.X}`` go to ``fill`` one at a time
    (left as written when ``fill`` is None); anything else stays as written.
    """
    if isinstance(value, str):
        whole = _ANY_REF.fullmatch(value)
        if whole:
            return _resolve(whole, outcomes, current, fill)
        return _ANY_REF.sub(lambda m: _as_text(_resolve(m, outcomes, current, fill)), value)
    items = as_list(value)
    if items is not None:
        return [_substitute(item, outcomes, current, fill) for item in items]
    obj = as_object(value)
    if obj is not None:
        return {key: _substitute(item, outcomes, current, fill) for key, item in obj.items()}
    return value


def _resolve(
    match: re.Match[str], outcomes: Mapping[int, _Outcome], current: int, fill: Callable[[str], Any] | None
) -> Any:
    inner = match.group(1)
    step = _STEP_REF.fullmatch(inner)
    if step is not None:
        return _lookup(match.group(0), step, outcomes, current)
    if fill is not None and (inner.startswith("params.") or inner.startswith("env.")):
        return fill(match.group(0))
    return match.group(0)


def _lookup(reference: str, match: re.Match[str], outcomes: Mapping[int, _Outcome], current: int) -> Any:
    index = int(match.group(1))
    what = match.group(2)
    if index >= current:
        raise _BrokenReference(reference, f"refers to step {index}, which has not run before this one")
    outcome = outcomes.get(index)
    if outcome is None:
        raise _BrokenReference(reference, f"refers to step {index}, which has no result")
    if what == "is_error":
        return outcome.is_error
    if outcome.is_error:
        raise _BrokenReference(reference, f"refers to step {index}, which failed")
    if what == "result":
        return outcome.text
    pointer = what[len("result") :]
    document = outcome.structured
    if not outcome.has_structured:
        try:
            document = json.loads(outcome.text)
        except (ValueError, RecursionError):
            raise _BrokenReference(
                reference, f"points into step {index}'s result, which has no structured content and is not JSON"
            ) from None
    found, target = resolve_pointer(document, pointer)
    if not found:
        raise _BrokenReference(reference, f"points at nothing in step {index}'s result")
    return target


def _as_text(value: Any) -> str:
    # The same text truss.contract writes for an embedded params/env value: RFC 8785 JSON.
    if isinstance(value, str):
        return value
    return canonical(value).decode("utf-8")
