"""The crash matrix: ``truss run`` killed (SIGKILL) at every fault point, for a tool declared safe to
re-send (``other``, in ``retry_in_doubt``) and one that is not (``count``), then resumed.

The counting server records every invocation durably before answering, so the tests count exactly
how often each call reached it. The plan calls ``count first`` (completes before every fault) and
then ``<tool> second``, the call each fault hits. All twelve runs go through each phase at once
(the phases are subprocesses), so the matrix costs a few runs' time, not twelve.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.durability.support import cli, counting_contract, invocations, kinds, make_home, truss
from truss._faults import POINTS

RETRYABLE, NOT_RETRYABLE = "other", "count"
# The six: task_pending needs a task server (test_tasks.py), after_review a panel check
# (tests/panel/test_durability.py).
CALL_POINTS = POINTS - {"task_pending", "after_review"}
CASES = [(point, tool) for point in sorted(CALL_POINTS) for tool in (NOT_RETRYABLE, RETRYABLE)]
IN_DOUBT_POINTS = {"after_intent", "during_call", "after_call"}  # the intent is durable, the result is not
SENT_POINTS = {"during_call", "after_call"}  # ...and the server has the request


@dataclass
class Case:
    point: str
    tool: str
    directory: Path
    home: Path
    contract: Path
    session: str = "s-crash"
    crashed: subprocess.CompletedProcess[str] | None = None
    resumed: subprocess.CompletedProcess[str] | None = None
    resolved: subprocess.CompletedProcess[str] | None = None
    finished: subprocess.CompletedProcess[str] | None = None
    replayed: subprocess.CompletedProcess[str] | None = None
    verified: list[subprocess.CompletedProcess[str]] = field(default_factory=list[subprocess.CompletedProcess[str]])
    counts_after_resume: dict[str, int] = field(default_factory=dict[str, int])
    recorded_at_crash: list[str] = field(default_factory=list[str])

    @property
    def in_doubt(self) -> bool:
        return self.point in IN_DOUBT_POINTS and self.tool == NOT_RETRYABLE


def _each(cases: list[Case], work: Callable[[Case], None]) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(work, cases))


def _verify(case: Case) -> None:
    case.verified.append(cli(case.home, "ledger", "verify"))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Case]:
    cases: list[Case] = []
    for point, tool in CASES:
        directory = tmp_path_factory.mktemp(f"{point}-{tool}")
        contract = counting_contract(
            directory, steps=[("mcp:cnt:count", {"key": "first"}), (f"mcp:cnt:{tool}", {"key": "second"})],
            check_tool=f"mcp:cnt:{tool}",
        )  # fmt: skip
        cases.append(Case(point, tool, directory, make_home(directory / "home"), contract))

    def crash(case: Case) -> None:
        fault = case.point if case.point == "during_verdict" else f"{case.point}:2"
        environ = {"TRUSS_FAULT": fault}
        case.crashed = truss(case.home, "run", str(case.contract), "--session", case.session, env=environ)
        case.recorded_at_crash = kinds(case.home, case.session)

    def resume(case: Case) -> None:
        case.resumed = truss(case.home, "resume", case.session)
        case.counts_after_resume = dict(invocations(case.directory))

    def finish(case: Case) -> None:
        if case.resolved is not None:
            case.finished = truss(case.home, "resume", case.session)

    # Runs and resumes are subprocesses, several at once; the commands that connect nothing run
    # through the CLI's entry point in this process, one at a time.
    _each(cases, crash)
    for case in cases:
        _verify(case)
    _each(cases, resume)
    for case in cases:
        _verify(case)
        if case.resumed is not None and case.resumed.returncode == 3:
            how = ["--result", '"counted second"'] if case.point in SENT_POINTS else ["--not-sent"]
            case.resolved = cli(case.home, "resolve", case.session, "c2.0", *how)
    _each(cases, finish)
    for case in cases:
        if case.finished is not None:
            _verify(case)
        case.replayed = cli(case.home, "replay", case.session)
    return {(c.point, c.tool): c for c in cases}


def _text(process: subprocess.CompletedProcess[str] | None) -> str:
    return "" if process is None else process.stdout + process.stderr


def _final(case: Case) -> subprocess.CompletedProcess[str]:
    done = case.finished or case.resumed
    assert done is not None
    return done


@pytest.mark.slow
@pytest.mark.parametrize(("point", "tool"), CASES)
def test_a_run_killed_at_each_fault_point_resumes_to_a_pass_and_its_ledger_verifies_at_every_stage(
    matrix: dict[tuple[str, str], Case], point: str, tool: str
) -> None:
    case = matrix[(point, tool)]
    assert case.crashed is not None and case.crashed.returncode == -9, case.crashed
    assert all(v.returncode == 0 for v in case.verified), [v.stdout + v.stderr for v in case.verified]
    assert len(case.verified) == (3 if case.in_doubt else 2)
    final = _final(case)
    assert final.returncode == 0, final.stdout + final.stderr
    assert "verdict     pass" in final.stdout
    assert case.replayed is not None and case.replayed.returncode == 0, _text(case.replayed)
    recorded = kinds(case.home, case.session)
    assert recorded.count("verdict") == 1 and recorded[-1] == "session_ended"


@pytest.mark.slow
@pytest.mark.parametrize(("point", "tool"), CASES)
def test_completed_calls_reach_the_server_exactly_once_and_only_a_retryable_sent_call_is_sent_again(
    matrix: dict[tuple[str, str], Case], point: str, tool: str
) -> None:
    case = matrix[(point, tool)]
    counts = invocations(case.directory)
    assert counts["count first"] == 1
    sent_before_crash = point in SENT_POINTS or point in ("after_result", "during_verdict")
    resent = tool == RETRYABLE and point in SENT_POINTS
    assert counts[f"{tool} second"] == (2 if resent else 1), counts
    assert sent_before_crash or point in ("before_intent", "after_intent")


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(IN_DOUBT_POINTS))
def test_an_in_doubt_call_of_a_tool_not_safe_to_resend_stops_with_exit_3_until_resolved(
    matrix: dict[tuple[str, str], Case], point: str
) -> None:
    case = matrix[(point, NOT_RETRYABLE)]
    assert case.resumed is not None and case.resumed.returncode == 3, _text(case.resumed)
    assert "in doubt    c2.0" in case.resumed.stdout and f"truss resolve {case.session} c2.0" in case.resumed.stdout
    # Not re-sent while in doubt: the server saw it only if it was sent before the crash.
    assert case.counts_after_resume.get("count second", 0) == (1 if point in SENT_POINTS else 0)
    assert case.resolved is not None and case.resolved.returncode == 0, _text(case.resolved)
    recorded = kinds(case.home, case.session)
    assert recorded.count("in_doubt") == 1 and recorded.count("in_doubt_resolved") == 1
    assert recorded.index("in_doubt") < recorded.index("in_doubt_resolved")


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(CALL_POINTS - IN_DOUBT_POINTS))
def test_a_crash_outside_the_doubt_window_resumes_without_asking_anyone(
    matrix: dict[tuple[str, str], Case], point: str
) -> None:
    for tool in (NOT_RETRYABLE, RETRYABLE):
        case = matrix[(point, tool)]
        assert case.resumed is not None and case.resumed.returncode == 0, _text(case.resumed)
        assert "in_doubt" not in kinds(case.home, case.session)


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(IN_DOUBT_POINTS))
def test_a_tool_declared_safe_to_resend_is_resent_on_resume_without_an_in_doubt_stop(
    matrix: dict[tuple[str, str], Case], point: str
) -> None:
    case = matrix[(point, RETRYABLE)]
    assert case.resumed is not None and case.resumed.returncode == 0, _text(case.resumed)
    recorded = kinds(case.home, case.session)
    assert "in_doubt" not in recorded and recorded.count("mcp_tool_intent") == 3  # first, second, second again


@pytest.mark.slow
@pytest.mark.parametrize("tool", [NOT_RETRYABLE, RETRYABLE])
def test_a_model_turn_committed_without_its_own_flush_is_recorded_when_the_run_dies_before_its_intent(
    matrix: dict[tuple[str, str], Case], tool: str
) -> None:
    # The turn proposing call 2 shares the flush of that call's intent; killed just before the intent,
    # the turn is in the ledger all the same (a process crash loses no committed entry), and the
    # resumed run replays it instead of asking the plan again.
    case = matrix[("before_intent", tool)]
    assert case.recorded_at_crash[-1] == "model_turn", case.recorded_at_crash
    assert case.recorded_at_crash.count("model_turn") == 2
    recorded = kinds(case.home, case.session)
    assert recorded.count("model_turn") == 3  # turns 1 and 2 once each, then the final answer
    assert recorded.count("mcp_tool_intent") == 2
