"""Replay and resume of a session with a panel, through ``truss`` as a user runs it.

The agent plays a plan against the wire-level tools server (``tests/e2e/servers/tools.py``); the
reviewers are OpenAI-compatible models on a loopback server in this process. A crash is a real
SIGKILL at the ``after_review`` fault point (``truss/_faults.py``).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.durability.support import entries, make_home, truss
from tests.gate.support import read_runtime
from tests.panel.support import approving, panel_of, run, scripted_reviewer
from tests.panel.support import panel_contract as in_process_contract
from tests.panel.test_real_providers import openai_review
from tests.providers._support import LoopbackServer, Recorded, Reply
from truss.durable import replay_session

TOOLS = Path(__file__).resolve().parent.parent / "e2e" / "servers" / "tools.py"
FINAL = "The echo said hello [c1.0]."
WAIT_S = 60  # bounds the held reviewer's wait; never reached when things work


class Reviewers:
    """A loopback model server answering by model name; ``hold`` keeps a model's answer back until
    ``release`` (a reviewer still thinking when the run dies)."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.released = threading.Event()
        self.server = LoopbackServer(self._respond)

    def _respond(self, request: Recorded) -> Reply:
        if request.body.get("model") in self.held:
            self.released.wait(WAIT_S)
        return Reply(body=openai_review(approving(1, ["c1.0"])))

    def asked(self, since: int = 0) -> list[str]:
        return [str(r.body.get("model")) for r in self.server.requests[since:]]


@pytest.fixture
def reviewers() -> Iterator[Reviewers]:
    models = Reviewers()
    models.server.start()
    try:
        yield models
    finally:
        models.released.set()
        models.server.close()


def contract(directory: Path, url: str) -> Path:
    path = directory / "panel.toml"
    path.write_text(
        f"""
[contract]
name = "panel-durable"
intent = "Echo hello and say what came back."
[agent]
final = {json.dumps(FINAL)}
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = {{ text = "hello" }}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS))}]
allow_tools = ["echo"]
connect_timeout = "60s"
[[done.checks]]
kind = "panel"
quorum = 2
[[done.checks.reviewers]]
name = "first"
provider = "openai"
model = "first"
base_url = "{url}/v1"
[[done.checks.reviewers]]
name = "second"
provider = "openai"
model = "second"
base_url = "{url}/v1"
""",
        encoding="utf-8",
    )
    return path


def _reviews(home: Path, session: str) -> list[Any]:
    return [e for e in entries(home, session) if e.kind == "panel_review"]


def test_resume_after_a_crash_between_two_reviewers_asks_only_the_remaining_one(
    tmp_path: Path, reviewers: Reviewers
) -> None:
    home = make_home(tmp_path / "home")
    path = contract(tmp_path, reviewers.server.url)
    reviewers.held.add("second")
    crashed = truss(home, "run", str(path), "--session", "s1", env={"TRUSS_FAULT": "after_review:1"})
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    assert [e.body["name"] for e in _reviews(home, "s1")] == ["first"]
    reviewers.released.set()
    before = len(reviewers.server.requests)

    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert reviewers.asked(before) == ["second"]
    assert reviewers.asked().count("first") == 1
    kinds = [e.kind for e in entries(home, "s1")]
    resumed_at = kinds.index("session_resumed")
    assert [e.body["name"] for e in _reviews(home, "s1")] == ["first", "second"]
    assert kinds[resumed_at + 1 :].count("panel_review") == 1
    assert truss(home, "ledger", "verify", "s1").returncode == 0
    replay = truss(home, "replay", "s1", "--json", env={"PATH": ""})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["matches"] is True


def test_replay_rederives_a_panel_verdict_with_no_model_reachable(tmp_path: Path, reviewers: Reviewers) -> None:
    home = make_home(tmp_path / "home")
    path = contract(tmp_path, reviewers.server.url)
    ran = truss(home, "run", str(path), "--session", "s1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    reviewers.server.close()  # no model answers any more
    asked = len(reviewers.server.requests)

    replay = truss(home, "replay", "s1", "--json", env={"PATH": ""})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    report = json.loads(replay.stdout)
    assert report["matches"] is True
    assert report["replayed"]["checks"][0]["panel"]["outcome"] == "approved"
    assert len(reviewers.server.requests) == asked


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("reviewers_toml", "status"),
    [
        (scripted_reviewer(judge="supported") * 3, "pass"),
        (scripted_reviewer(judge="supported") + scripted_reviewer(judge="contradicted") * 2, "fail"),
        (scripted_reviewer(judge="supported") + scripted_reviewer(answer="no form") * 2, "error"),
    ],
    ids=["approved", "rejected", "undecided"],
)
async def test_replay_reaches_the_recorded_panel_verdict_whatever_the_reviewers_said(
    tmp_path: Path, reviewers_toml: str, status: str
) -> None:
    text = in_process_contract(final="The file says version 2.1 [c1.0].", reviewers=reviewers_toml, quorum=2)
    outcome, store = await run(tmp_path, text)
    assert outcome.status == status
    report = await replay_session(read_runtime(store), outcome.session)
    assert report.matches, report.reason
    assert report.replayed is not None
    assert report.replayed["checks"][0]["panel"] == panel_of(outcome)
