"""The scripted provider: steps in order, references to earlier results, broken references, determinism."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.providers._support import make_contract
from truss._errors import InputError
from truss.contract import Contract
from truss.providers import ScriptedProvider, TurnRequest, TurnResponse, make_provider, resolve_pointer
from truss.testing import ManualClock

pytestmark = pytest.mark.anyio

Tool = Callable[[str, dict[str, Any]], dict[str, Any]]


def scripted(steps: list[dict[str, Any]], final: str | None = None) -> Any:
    agent: dict[str, Any] = {"steps": steps}
    if final is not None:
        agent["final"] = final
    return make_provider(make_contract(**agent), environ={}, clock=ManualClock())


async def play(provider: Any, tool: Tool) -> tuple[list[TurnResponse], list[tuple[str, dict[str, Any]]]]:
    """Drive ``provider`` the way the loop does; ``tool`` answers each call with a tool message body."""
    messages: list[dict[str, Any]] = [{"role": "user", "text": "do the thing"}]
    responses: list[TurnResponse] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    for turn in range(1, 50):
        response = await provider.next_turn(TurnRequest("", list(messages), [], turn))
        responses.append(response)
        if not response.tool_calls:
            break
        messages.append(
            {"role": "assistant", "text": response.text, "tool_calls": [c.to_json() for c in response.tool_calls]}
        )
        for call in response.tool_calls:
            calls.append((call.name, call.arguments))
            messages.append({"role": "tool", "call_id": call.id, "name": call.name, **tool(call.name, call.arguments)})
    return responses, calls


def ok(text: str = "", structured: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"is_error": False, "text": text}
    if structured is not None:
        out["structured"] = structured
    return out


def failed(text: str = "boom") -> dict[str, Any]:
    return {"is_error": True, "text": text}


TIME = {"datetime": "2026-01-01T12:00:00+00:00", "timezone": "UTC", "offset": 0, "tags": ["a", "b"], "a/b": {"~k": 7}}


async def test_steps_are_played_one_per_turn_with_step_ids_then_the_final_text() -> None:
    provider = scripted(
        [
            {"tool": "mcp:time:get_current_time", "arguments": {"timezone": "UTC"}},
            {"tool": "mcp:git:git_status", "arguments": {"repo_path": "."}},
        ],
        final="done",
    )
    responses, calls = await play(provider, lambda name, args: ok("fine"))
    assert [[(c.id, c.name) for c in r.tool_calls] for r in responses] == [
        [("step-0", "mcp__time__get_current_time")],
        [("step-1", "mcp__git__git_status")],
        [],
    ]
    assert [r.stop_reason for r in responses] == ["tool_use", "tool_use", "end_turn"]
    assert calls[0][1] == {"timezone": "UTC"}
    assert responses[-1].text == "done"
    assert all(r.usage.total == 0 for r in responses)


async def test_a_whole_string_reference_keeps_the_json_type_and_an_embedded_one_is_stringified() -> None:
    provider = scripted(
        [
            {"tool": "mcp:time:get_current_time", "arguments": {}},
            {
                "tool": "mcp:echo:echo",
                "arguments": {
                    "text": "${steps.0.result}",
                    "offset": "${steps.0.result/offset}",
                    "tags": "${steps.0.result/tags}",
                    "first_tag": "${steps.0.result/tags/0}",
                    "escaped": "${steps.0.result/a~1b/~0k}",
                    "failed": "${steps.0.is_error}",
                    "sentence": "zone ${steps.0.result/timezone}, offset ${steps.0.result/offset}, "
                    "tags ${steps.0.result/tags}",
                    "nested": [{"deep": "${steps.0.result/offset}"}],
                },
            },
        ]
    )
    _, calls = await play(provider, lambda name, args: ok("it is noon", TIME) if "time" in name else ok())
    assert calls[1][1] == {
        "text": "it is noon",
        "offset": 0,
        "tags": ["a", "b"],
        "first_tag": "a",
        "escaped": 7,
        "failed": False,
        "sentence": 'zone UTC, offset 0, tags ["a","b"]',
        "nested": [{"deep": 0}],
    }


async def test_a_pointer_reads_the_text_as_json_when_the_server_sent_no_structured_content() -> None:
    provider = scripted(
        [
            {"tool": "mcp:time:get_current_time", "arguments": {}},
            {"tool": "mcp:time:convert_time", "arguments": {"time": "${steps.0.result/datetime}"}},
        ]
    )
    _, calls = await play(provider, lambda name, args: ok('{"datetime": "2026-01-01T12:00:00+00:00"}'))
    assert calls[1][1] == {"time": "2026-01-01T12:00:00+00:00"}


async def test_a_reference_to_a_failed_step_ends_the_plan_without_calling_the_step() -> None:
    provider = scripted(
        [
            {"tool": "mcp:git:git_status", "arguments": {}},
            {"tool": "mcp:git:git_diff", "arguments": {"target": "${steps.0.result}"}},
            {"tool": "mcp:git:git_log", "arguments": {}},
        ]
    )
    responses, calls = await play(provider, lambda name, args: failed())
    assert [name for name, _ in calls] == ["mcp__git__git_status"]
    last = responses[-1]
    assert (last.tool_calls, last.stop_reason) == ([], "end_turn")
    assert "step 1" in last.text
    assert "${steps.0.result}" in last.text


async def test_is_error_of_a_failed_step_can_be_read_and_the_plan_goes_on() -> None:
    provider = scripted(
        [
            {"tool": "mcp:fs:write_file", "arguments": {}},
            {"tool": "mcp:log:note", "arguments": {"write_failed": "${steps.0.is_error}"}},
        ]
    )
    _, calls = await play(provider, lambda name, args: failed("denied by policy") if "write" in name else ok())
    assert calls[1] == ("mcp__log__note", {"write_failed": True})


@pytest.mark.parametrize(
    "reference",
    [
        "${steps.5.result}",  # no such step
        "${steps.1.result}",  # the step itself: it has not run
        "${steps.0.result/missing}",  # a pointer that finds nothing
        "${steps.0.result/tags/2}",  # past the end of an array
        "${steps.0.result/tags/01}",  # not an array index
        "${steps.0.result/offset/deeper}",  # into a number
    ],
)
async def test_a_reference_that_finds_nothing_ends_the_plan_with_a_clear_text(reference: str) -> None:
    provider = scripted(
        [
            {"tool": "mcp:time:get_current_time", "arguments": {}},
            {"tool": "mcp:echo:echo", "arguments": {"x": reference}},
        ]
    )
    responses, calls = await play(provider, lambda name, args: ok("noon", TIME))
    assert len(calls) == 1
    assert responses[-1].tool_calls == []
    assert reference in responses[-1].text


async def test_a_pointer_into_a_text_result_that_is_not_json_ends_the_plan() -> None:
    provider = scripted(
        [{"tool": "mcp:a:b", "arguments": {}}, {"tool": "mcp:a:c", "arguments": {"x": "${steps.0.result/k}"}}]
    )
    responses, calls = await play(provider, lambda name, args: ok("plain words"))
    assert len(calls) == 1
    assert responses[-1].tool_calls == []


async def test_a_reference_inside_a_tool_result_is_never_expanded() -> None:
    provider = scripted(
        [
            {"tool": "mcp:a:first", "arguments": {}},
            {"tool": "mcp:a:second", "arguments": {}},
            {"tool": "mcp:a:third", "arguments": {"copy": "${steps.1.result}", "inline": "got ${steps.1.result}"}},
        ]
    )
    _, calls = await play(provider, lambda name, args: ok("${steps.0.result} ${env.HOME} ${params.x}"))
    assert calls[2][1] == {
        "copy": "${steps.0.result} ${env.HOME} ${params.x}",
        "inline": "got ${steps.0.result} ${env.HOME} ${params.x}",
    }


async def test_the_note_after_a_result_is_not_part_of_the_result() -> None:
    provider = scripted(
        [{"tool": "mcp:a:x", "arguments": {}}, {"tool": "mcp:a:y", "arguments": {"copy": "${steps.0.result}"}}]
    )
    _, calls = await play(provider, lambda name, args: {**ok("the result"), "note": "[budget left: tool_calls=3]"})
    assert calls[1][1] == {"copy": "the result"}


async def test_a_denied_step_that_nothing_refers_to_does_not_stop_the_plan() -> None:
    provider = scripted([{"tool": "mcp:a:x", "arguments": {}}, {"tool": "mcp:a:y", "arguments": {}}])
    responses, calls = await play(provider, lambda name, args: failed("denied") if name.endswith("x") else ok())
    assert [name for name, _ in calls] == ["mcp__a__x", "mcp__a__y"]
    assert "step(s) 0 returned an error" in responses[-1].text


async def test_the_final_text_may_refer_to_results() -> None:
    provider = scripted([{"tool": "mcp:time:now", "arguments": {}}], final="The time is ${steps.0.result/datetime}.")
    responses, _ = await play(provider, lambda name, args: ok("", TIME))
    assert responses[-1].text == "The time is 2026-01-01T12:00:00+00:00."


async def test_a_final_text_that_is_one_reference_to_an_object_is_written_as_json() -> None:
    provider = scripted([{"tool": "mcp:time:now", "arguments": {}}], final="${steps.0.result/a~1b}")
    responses, _ = await play(provider, lambda name, args: ok("", TIME))
    assert responses[-1].text == '{"~k":7}'


async def test_without_steps_the_first_turn_is_the_final_one() -> None:
    responses, calls = await play(scripted([]), lambda name, args: ok())
    assert calls == []
    assert len(responses) == 1
    assert responses[0].tool_calls == []


async def test_the_same_request_gives_the_same_response_from_any_instance() -> None:
    steps = [
        {"tool": "mcp:time:get_current_time", "arguments": {"timezone": "UTC"}},
        {"tool": "mcp:echo:echo", "arguments": {"x": "${steps.0.result/tags}", "y": "at ${steps.0.result/offset}"}},
    ]
    request = TurnRequest(
        "",
        [
            {"role": "user", "text": "go"},
            {
                "role": "assistant",
                "text": "",
                "tool_calls": [{"id": "step-0", "name": "mcp__time__get_current_time", "arguments": {}}],
            },
            {
                "role": "tool",
                "call_id": "step-0",
                "name": "mcp__time__get_current_time",
                "is_error": False,
                "text": "",
                "structured": TIME,
            },
        ],
        [],
        2,
    )
    first, second = scripted(steps), scripted(steps)
    answers = [await first.next_turn(request), await first.next_turn(request), await second.next_turn(request)]
    assert answers[0].to_json() == answers[1].to_json() == answers[2].to_json()
    assert answers[0].tool_calls[0].id == "step-1"
    assert isinstance(first, ScriptedProvider)
    await first.aclose()


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", (True, TIME)),
        ("/offset", (True, 0)),
        ("/a~1b/~0k", (True, 7)),
        ("/tags/1", (True, "b")),
        ("/tags/-", (False, None)),
        ("/tags/", (False, None)),
        ("offset", (False, None)),
        ("/nope", (False, None)),
    ],
)
def test_resolve_pointer_follows_rfc_6901(pointer: str, expected: tuple[bool, Any]) -> None:
    assert resolve_pointer(TIME, pointer) == expected


def with_params(steps: list[dict[str, Any]], values: dict[str, Any]) -> Contract:
    return Contract.model_validate(
        {
            "contract": {
                "name": "params-test",
                "intent": "test",
                "params": {"count": {"type": "integer"}, "label": {"type": "string"}},
            },
            "agent": {"steps": steps},
            "param_values": values,
        }
    )


async def test_params_and_env_are_filled_in_with_their_types_in_the_same_pass_as_step_references() -> None:
    contract = with_params(
        [
            {"tool": "mcp:a:first", "arguments": {}},
            {
                "tool": "mcp:a:second",
                "arguments": {
                    "count": "${params.count}",
                    "label": "${params.label}",
                    "line": "${params.count} x ${env.REPO} after ${steps.0.result}",
                },
            },
        ],
        {"count": 3, "label": "${steps.0.result}"},
    )
    provider = make_provider(contract, environ={"REPO": "/srv/repo"}, clock=ManualClock())
    _, calls = await play(provider, lambda name, args: ok("first-result"))
    # A parameter's value is data: a reference inside it is not expanded.
    assert calls[1][1] == {"count": 3, "label": "${steps.0.result}", "line": "3 x /srv/repo after first-result"}


def test_a_step_using_an_unset_environment_variable_is_refused_before_the_run_starts() -> None:
    contract = with_params([{"tool": "mcp:a:b", "arguments": {"path": "${env.TRUSS_TEST_UNSET}"}}], {})
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={}, clock=ManualClock())
    assert (caught.value.env, caught.value.step, caught.value.exit_code) == ("TRUSS_TEST_UNSET", 0, 2)


class _CountedMessage(dict[str, Any]):
    """A message that counts how often the provider looks into it."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        _CountedMessage.reads += 1
        return super().get(key, default)


async def test_a_turn_reads_only_the_messages_added_since_the_turn_before() -> None:
    steps = [{"tool": "mcp:echo:echo", "arguments": {"i": i}} for i in range(200)]
    provider = scripted(steps)
    messages: list[dict[str, Any]] = [_CountedMessage(role="user", text="go")]
    per_turn: list[int] = []
    for turn in range(1, 202):
        _CountedMessage.reads = 0
        response = await provider.next_turn(TurnRequest("", list(messages), [], turn))
        per_turn.append(_CountedMessage.reads)
        if not response.tool_calls:
            break
        [call] = response.tool_calls
        messages.append(_CountedMessage(role="assistant", text="", tool_calls=[call.to_json()]))
        messages.append(_CountedMessage(role="tool", call_id=call.id, name=call.name, is_error=False, text="ok"))
    assert len(per_turn) == 201
    assert max(per_turn[1:]) == min(per_turn[1:]), "a late turn reads as much as an early one"


async def test_a_request_that_does_not_continue_the_last_one_is_read_from_its_start() -> None:
    steps = [
        {"tool": "mcp:echo:echo", "arguments": {"x": 1}},
        {"tool": "mcp:echo:echo", "arguments": {"x": "${steps.0.result}"}},
        {"tool": "mcp:echo:echo", "arguments": {"x": 3}},
    ]
    provider = scripted(steps)
    responses, calls = await play(provider, lambda _name, _args: ok("first"))
    assert calls[1] == ("mcp__echo__echo", {"x": "first"})
    # The same instance, a different conversation (another run's): its own results, not the last run's.
    _, again = await play(provider, lambda _name, _args: ok("second"))
    assert again[1] == ("mcp__echo__echo", {"x": "second"})
    assert responses[-1].tool_calls == []


async def test_an_incremental_reading_answers_as_a_fresh_instance_reading_the_whole_request() -> None:
    steps = [
        {"tool": "mcp:echo:echo", "arguments": {"x": 0}},
        {"tool": "mcp:echo:echo", "arguments": {"x": "${steps.0.is_error}"}},
        {"tool": "mcp:echo:echo", "arguments": {"x": "${steps.1.result}"}},
    ]
    provider = scripted(steps)
    messages: list[dict[str, Any]] = [{"role": "user", "text": "go"}]
    for turn in range(1, 6):
        request = TurnRequest("", list(messages), [], turn)
        live = await provider.next_turn(request)
        fresh = await scripted(steps).next_turn(request)
        assert live.to_json() == fresh.to_json()
        if not live.tool_calls:
            assert "step(s) 0, 2 returned an error" in live.text
            break
        [call] = live.tool_calls
        messages.append({"role": "assistant", "text": "", "tool_calls": [call.to_json()]})
        outcome = failed() if call.id in {"step-0", "step-2"} else ok(f"r{turn}")
        messages.append({"role": "tool", "call_id": call.id, "name": call.name, **outcome})
