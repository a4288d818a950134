"""A panel of real providers: Anthropic and OpenAI-compatible reviewers against loopback servers that
speak the real wire formats (``tests/providers/_support.py``), inside a whole run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gate.support import files_containing
from tests.panel.support import panel_contract, panel_of, reviews, run
from tests.providers._support import LoopbackServer, Recorded, Reply

pytestmark = pytest.mark.anyio

ANTHROPIC_KEY = "sk-ant-panel-canary-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
OPENAI_KEY = "sk-openai-panel-canary-11223344556677889900aabbccddeeff"
ENVIRON = {"REVIEW_ANTHROPIC_KEY": ANTHROPIC_KEY, "REVIEW_OPENAI_KEY": OPENAI_KEY}
FINAL = "The VERSION file says the version is 2.1 [c1.0]."
FORM = {"claims": [{"claim": 0, "judgement": "supported", "calls": ["c1.0"], "reason": "c1.0 says version 2.1"}]}


def anthropic_review(form: Any, usage: tuple[int, int] = (900, 60)) -> dict[str, Any]:
    return {
        "id": "msg_review",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "tool_use", "id": "toolu_r1", "name": "submit_review", "input": form}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def openai_review(form: Any, usage: tuple[int, int] = (800, 50)) -> dict[str, Any]:
    call = {"id": "call_r1", "type": "function", "function": {"name": "submit_review", "arguments": json.dumps(form)}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "id": "chatcmpl-review",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def openai_text(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-text",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 700, "completion_tokens": 40, "total_tokens": 740},
    }


def by_model(answers: dict[str, Reply]) -> Any:
    def respond(request: Recorded) -> Reply:
        return answers.get(str(request.body.get("model")), Reply(500, {"error": "unknown model"}))

    return respond


@pytest.fixture
def anthropic() -> Iterator[LoopbackServer]:
    server = LoopbackServer(by_model({"claude-test": Reply(body=anthropic_review(FORM))})).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def openai() -> Iterator[LoopbackServer]:
    answers = {
        "gpt-test": Reply(body=openai_review(FORM)),
        "local-qwen": Reply(body=openai_text(json.dumps(FORM))),  # a server that ignores tool_choice
        "broken": Reply(400, {"error": {"message": "bad request"}}),
        "costly": Reply(body=openai_review(FORM, usage=(90, 10))),
    }
    server = LoopbackServer(by_model(answers)).start()
    try:
        yield server
    finally:
        server.close()


def mixed(anthropic: LoopbackServer, openai: LoopbackServer) -> str:
    return f"""
[[done.checks.reviewers]]
name = "claude"
provider = "anthropic"
model = "claude-test"
base_url = "{anthropic.url}"
api_key_env = "REVIEW_ANTHROPIC_KEY"
[[done.checks.reviewers]]
name = "gpt"
provider = "openai"
model = "gpt-test"
base_url = "{openai.url}/v1"
api_key_env = "REVIEW_OPENAI_KEY"
temperature = 0.0
[[done.checks.reviewers]]
name = "local"
provider = "openai"
model = "local-qwen"
base_url = "{openai.url}/v1"
max_output_tokens = 1024
"""


async def test_a_panel_of_mixed_providers_reviews_over_their_real_wire_formats(
    tmp_path: Path, anthropic: LoopbackServer, openai: LoopbackServer
) -> None:
    rubric = 'rubric = "Numbers must appear in a cited result."'
    text = panel_contract(final=FINAL, reviewers=mixed(anthropic, openai), quorum=3, panel=rubric,
                          budget="max_tokens = 100000")  # fmt: skip
    outcome, store = await run(tmp_path, text, environ=ENVIRON)
    assert outcome.status == "pass", outcome.reason
    panel = panel_of(outcome)
    assert [(r["name"], r["provider"], r["model"], r["outcome"]) for r in panel["reviewers"]] == [
        ("claude", "anthropic", "claude-test", "approve"),
        ("gpt", "openai", "gpt-test", "approve"),
        ("local", "openai", "local-qwen", "approve"),
    ]
    [to_claude] = anthropic.requests
    assert to_claude.path == "/v1/messages"
    assert to_claude.headers["x-api-key"] == ANTHROPIC_KEY
    assert to_claude.body["tool_choice"] == {"type": "tool", "name": "submit_review"}
    assert [t["name"] for t in to_claude.body["tools"]] == ["submit_review"]
    assert "Numbers must appear in a cited result." in to_claude.body["system"]
    subject = json.loads(to_claude.body["messages"][0]["content"][0]["text"])
    assert subject["calls"][0]["result"]["content"][0]["text"] == "the file VERSION says: version 2.1"
    to_gpt = next(r for r in openai.requests if r.body["model"] == "gpt-test")
    to_local = next(r for r in openai.requests if r.body["model"] == "local-qwen")
    assert to_gpt.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "authorization" not in to_local.headers  # no key named: none sent
    assert to_gpt.body["tool_choice"] == {"type": "function", "function": {"name": "submit_review"}}
    assert to_gpt.body["temperature"] == 0.0
    assert to_local.body["max_tokens"] == 1024
    assert len(anthropic.requests) == 1 and len(openai.requests) == 2
    usage = {e.body["name"]: e.body["usage"] for e in reviews(store)}
    assert usage["claude"] == {"input_tokens": 900, "output_tokens": 60}
    for key in (ANTHROPIC_KEY, OPENAI_KEY):
        assert files_containing(tmp_path, key.encode()) == []


async def test_a_reviewer_whose_provider_fails_does_not_approve_and_its_error_is_recorded(
    tmp_path: Path, openai: LoopbackServer
) -> None:
    reviewers = f"""
[[done.checks.reviewers]]
provider = "openai"
model = "gpt-test"
base_url = "{openai.url}/v1"
[[done.checks.reviewers]]
provider = "openai"
model = "broken"
base_url = "{openai.url}/v1"
max_attempts = 1
"""
    outcome, store = await run(tmp_path, panel_contract(final=FINAL, reviewers=reviewers, quorum=1))
    assert outcome.status == "pass"
    failed = panel_of(outcome)["reviewers"][1]
    assert (failed["outcome"], failed["cause"]) == ("failed", "provider")
    entry = next(e for e in reviews(store) if e.body["reviewer"] == 1)
    assert entry.body["failure"]["cause"] == "provider"
    assert "response" not in entry.body


async def test_a_reviewer_over_the_panels_token_limit_does_not_count(tmp_path: Path, openai: LoopbackServer) -> None:
    reviewers = f"""
[[done.checks.reviewers]]
provider = "openai"
model = "costly"
base_url = "{openai.url}/v1"
[[done.checks.reviewers]]
provider = "openai"
model = "costly"
base_url = "{openai.url}/v1"
"""
    text = panel_contract(final=FINAL, reviewers=reviewers, quorum=1, panel="max_tokens = 150")
    outcome, store = await run(tmp_path, text)
    assert outcome.status == "pass"
    outcomes = sorted((r["outcome"], r.get("cause")) for r in panel_of(outcome)["reviewers"])
    assert outcomes == [("approve", None), ("failed", "budget")]
    over = next(e for e in reviews(store) if "failure" in e.body)
    assert "response" in over.body  # the answer was received and paid for: it is kept


async def test_a_reviewer_key_that_is_not_set_stops_the_run_before_anything_is_called(
    tmp_path: Path, anthropic: LoopbackServer, openai: LoopbackServer
) -> None:
    from truss import InputError

    text = panel_contract(final=FINAL, reviewers=mixed(anthropic, openai), quorum=1)
    with pytest.raises(InputError) as caught:
        await run(tmp_path, text, environ={"REVIEW_ANTHROPIC_KEY": ANTHROPIC_KEY})
    assert caught.value.fields["reviewer"] == "gpt"
    assert caught.value.fields["env"] == "REVIEW_OPENAI_KEY"
    assert anthropic.requests == [] and openai.requests == []


async def test_no_reviewer_is_asked_when_the_run_has_no_tokens_left(tmp_path: Path) -> None:
    turns: list[int] = []

    def agent(request: Recorded) -> Reply:
        if request.body.get("model") != "agent-model":
            return Reply(body=openai_review(FORM))
        turns.append(1)
        if len(turns) == 1:
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": "mcp__srv__read", "arguments": '{"path": "VERSION"}'},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                               "usage": {"prompt_tokens": 100, "completion_tokens": 10}})  # fmt: skip
        message = {"role": "assistant", "content": FINAL}
        return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 180, "completion_tokens": 10}})  # fmt: skip

    server = LoopbackServer(agent).start()
    try:
        reviewers = f"""
[[done.checks.reviewers]]
provider = "openai"
model = "gpt-test"
base_url = "{server.url}/v1"
"""
        agent_keys = f'provider = "openai"\nmodel = "agent-model"\nbase_url = "{server.url}/v1"'
        text = panel_contract(final=FINAL, reviewers=reviewers, quorum=1, agent=agent_keys, budget="max_tokens = 300")
        outcome, store = await run(tmp_path, text, plan=False)
    finally:
        server.close()
    assert [r.body.get("model") for r in server.requests] == ["agent-model", "agent-model"]
    assert outcome.status == "error"
    [reviewer] = panel_of(outcome)["reviewers"]
    assert (reviewer["outcome"], reviewer["cause"]) == ("failed", "budget")
    [entry] = reviews(store)
    assert "response" not in entry.body and entry.body["failure"]["cause"] == "budget"
