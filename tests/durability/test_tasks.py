"""MCP Tasks: a task-augmented call records ``mcp_tool_pending`` with the task id; a run that stops
(a crash, a call timeout) resumes by polling the *same* task; a task the server no longer knows is
in doubt. Against server-everything's ``simulate-research-query`` (npm) and ``servers/tasks.py``,
whose tasks live in a file and so outlive a server process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import node_peer
from tests.durability.support import cli, entries, invocations, kinds, make_home, truss
from tests.gate.support import contract_from, files_containing, new_store
from truss._clock import SystemClock
from truss._errors import ToolCallError
from truss.contract import Contract
from truss.mcp.client import Mounts, connect
from truss.runtime import Runtime

TASKS_SERVER = Path(__file__).resolve().parent / "servers" / "tasks.py"
ATTACKS = Path(__file__).resolve().parent / "attacks"
CLOCK = SystemClock()


def _tasks_contract(directory: Path, *, call_timeout: str = "60s", **knobs: str) -> Path:
    path = directory / "tasks.toml"
    path.write_text(_tasks_toml(directory, call_timeout=call_timeout, **knobs), encoding="utf-8")
    return path


def _tasks_toml(directory: Path, *, call_timeout: str = "60s", **knobs: str) -> str:
    """The contract around ``servers/tasks.py``; ``knobs`` are its environment switches."""
    env = {
        "COUNT_FILE": str(directory / "count.txt"),
        "TASK_FILE": str(directory / "tasks.json"),
        "TASK_DONE_FILE": str(directory / "done"),
        **knobs,
    }
    return f"""
[contract]
name = "tasks"
intent = "build"
[[agent.steps]]
tool = "mcp:tk:build"
arguments = {{ key = "k" }}
[[mcp.servers]]
name = "tk"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TASKS_SERVER))}]
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}
allow_tools = ["build"]
call_timeout = "{call_timeout}"
connect_timeout = "60s"
[[done.checks]]
kind = "result_matches"
tool = "mcp:tk:build"
regex = "^built k$"
"""


def _pending_task(home: Path, session: str) -> str:
    [pending] = [e for e in entries(home, session) if e.kind == "mcp_tool_pending"]
    assert pending.body["kind"] == "task"
    return str(pending.body["task"])


@pytest.mark.slow
def test_truss_killed_while_a_task_runs_resumes_polling_the_same_task_and_never_sends_the_call_again(
    tmp_path: Path,
) -> None:
    home = make_home(tmp_path / "home")
    (tmp_path / "done").touch()
    contract = _tasks_contract(tmp_path)
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": "task_pending"})
    assert crashed.returncode == -9
    task = _pending_task(home, "s1")
    assert cli(home, "ledger", "verify").returncode == 0

    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    counts = invocations(tmp_path)
    assert counts["build k"] == 1 and counts[f"get {task}"] >= 1
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["task"] == task and kinds(home, "s1").count("mcp_tool_intent") == 1
    assert cli(home, "replay", "s1").returncode == 0


@pytest.mark.slow
def test_a_task_still_running_when_the_call_timeout_passes_suspends_and_resume_polls_it_again(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = _tasks_contract(tmp_path, call_timeout="1s")
    run = truss(home, "run", str(contract), "--session", "s1")
    assert run.returncode == 3, run.stdout + run.stderr
    assert "an MCP task still runs" in run.stdout
    task = _pending_task(home, "s1")

    (tmp_path / "done").touch()  # the work finishes while nobody is polling
    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert invocations(tmp_path)["build k"] == 1
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["task"] == task
    assert cli(home, "ledger", "verify").returncode == 0


@pytest.mark.slow
@pytest.mark.peers
def test_a_research_task_on_server_everything_completes_and_records_its_task_id(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = _everything_contract(tmp_path)
    run = truss(home, "run", str(contract), "--session", "s1")
    assert run.returncode == 0, run.stdout + run.stderr
    task = _pending_task(home, "s1")
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["task"] == task and not result.body["is_error"]


@pytest.mark.slow
@pytest.mark.peers
def test_a_task_lost_with_its_server_is_in_doubt_after_resume_and_resolve_finishes_the_run(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = _everything_contract(tmp_path)
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": "task_pending"})
    assert crashed.returncode == -9
    task = _pending_task(home, "s1")

    # server-everything keeps tasks in memory: the new server process does not know the task, so
    # whether the work happened is unknown and the tool is not declared safe to re-send.
    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    assert "in doubt    c1.0" in resumed.stdout
    assert kinds(home, "s1").count("in_doubt") == 1 and kinds(home, "s1").count("mcp_tool_intent") == 1
    report = '"# Research Report: durable tasks (recovered by hand)"'
    assert cli(home, "resolve", "s1", "c1.0", "--result", report).returncode == 0
    finished = truss(home, "resume", "s1")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["resolved"] > 0 and task
    assert cli(home, "ledger", "verify").returncode == 0


def _everything_contract(directory: Path) -> Path:
    command = node_peer("server-everything")
    path = directory / "research.toml"
    path.write_text(
        f"""
[contract]
name = "research"
intent = "research"
[[agent.steps]]
tool = "mcp:ev:simulate-research-query"
arguments = {{ topic = "durable tasks" }}
[[mcp.servers]]
name = "ev"
command = {json.dumps(command[0])}
args = [{json.dumps(command[1])}, "stdio"]
allow_tools = ["simulate-research-query"]
connect_timeout = "60s"
[[done.checks]]
kind = "result_matches"
tool = "mcp:ev:simulate-research-query"
regex = "Research Report: durable tasks"
""",
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
def test_no_wait_suspends_as_soon_as_the_task_is_created_and_resume_no_wait_takes_the_finished_result(
    tmp_path: Path,
) -> None:
    home = make_home(tmp_path / "home")
    contract = _tasks_contract(tmp_path)
    run = truss(home, "run", str(contract), "--session", "s1", "--no-wait", "--json")
    assert run.returncode == 3, run.stdout + run.stderr
    assert json.loads(run.stdout)["waiting_on"] == "task"
    task = _pending_task(home, "s1")
    (tmp_path / "done").touch()
    resumed = truss(home, "resume", "s1", "--no-wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert invocations(tmp_path)["build k"] == 1
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["task"] == task


@pytest.mark.slow
def test_ctrl_c_while_a_task_runs_records_interrupted_and_resume_polls_the_same_task(tmp_path: Path) -> None:
    import os
    import queue
    import signal
    import subprocess
    import threading

    from tests.conftest import REPO, truss_cmd

    home = make_home(tmp_path / "home")
    contract = _tasks_contract(tmp_path)
    environ = {**os.environ, "TRUSS_HOME": str(home)}
    environ.pop("TRUSS_FAULT", None)
    process = subprocess.Popen(
        [*truss_cmd(), "run", str(contract), "--session", "s1", "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, cwd=REPO,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None and process.stdout is not None
    # Only this thread reads stderr (communicate() would read it too, and could close it under the
    # thread); stdout is a few summary lines, read once the process has exited.
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr or []], daemon=True)
    reader.start()
    try:
        while "progress 0 building" not in lines.get(timeout=120):  # the task exists and is being polled
            pass
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
        out = process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        reader.join(timeout=30)
        process.stdout.close()
        process.stderr.close()
    assert process.returncode == 3, out
    assert "interrupted" in out
    task = _pending_task(home, "s1")

    (tmp_path / "done").touch()
    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert invocations(tmp_path)["build k"] == 1
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["task"] == task


# -- the one Tasks implementation: the same rules for truss run, serve-mcp and connect() ---------------


def _task_contract(directory: Path, **knobs: str) -> Contract:
    return contract_from(_tasks_toml(directory, **knobs))


async def _build(mounts: Mounts, *, timeout_s: float = 30) -> str | None:
    return await mounts.start_task(mounts.tools["mcp:tk:build"], {"key": "k"}, timeout_s=timeout_s)


@pytest.mark.anyio
async def test_a_task_id_of_5006_characters_holding_an_escape_is_refused_at_the_task_call(tmp_path: Path) -> None:
    attack = ATTACKS / "task_id_5006_chars_with_escape.json"
    contract = _task_contract(tmp_path, TASK_ID_FILE=str(attack))
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=CLOCK) as mounts:
            with pytest.raises(ToolCallError) as info:
                await _build(mounts)
    assert (info.value.cause, info.value.tool) == ("protocol_error", "build")
    shown = info.value.diagnostics() + json.dumps(info.value.to_json())
    assert "\x1b" not in shown and "AAAAAAAAAA" not in shown


@pytest.mark.slow
def test_a_task_id_of_5006_characters_holding_an_escape_fails_the_call_and_is_recorded_nowhere(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    attack = ATTACKS / "task_id_5006_chars_with_escape.json"
    contract = _tasks_contract(tmp_path, TASK_ID_FILE=str(attack))
    run = truss(home, "run", str(contract), "--session", "s1")
    assert run.returncode == 4, run.stdout + run.stderr  # a call that failed below the tool: an error verdict
    [result] = [e for e in entries(home, "s1") if e.kind == "mcp_tool_call"]
    assert result.body["failure"]["cause"] == "protocol_error" and "task" not in result.body
    assert "mcp_tool_pending" not in kinds(home, "s1")
    task_id: str = json.loads(attack.read_text(encoding="utf-8"))["task_id"]
    assert files_containing(home, task_id[:16].encode()) == []
    assert files_containing(home, task_id[-300:].encode()) == []
    assert "\x1b" not in run.stdout + run.stderr
    assert cli(home, "ledger", "verify").returncode == 0


@pytest.mark.anyio
async def test_a_server_that_does_not_offer_tasks_gets_plain_calls_even_for_a_task_tool(tmp_path: Path) -> None:
    contract = _task_contract(tmp_path, TASK_SUPPORT="optional", NO_TASK_CAPABILITY="1")
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=CLOCK) as mounts:
            assert await _build(mounts) is None
            result = await mounts.call(mounts.tools["mcp:tk:build"], {"key": "k"}, timeout_s=30)
    assert result.text == "built k"
    assert invocations(tmp_path) == {"plain k": 1}


@pytest.mark.anyio
async def test_an_optional_task_tool_runs_as_a_task_asking_a_day_of_ttl(tmp_path: Path) -> None:
    (tmp_path / "done").touch()
    contract = _task_contract(tmp_path, TASK_SUPPORT="optional")
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=CLOCK) as mounts:
            task = await _build(mounts)
            assert task == "task-k"
            result = await mounts.task_result(mounts.tools["mcp:tk:build"], task, timeout_s=30)
    assert result is not None and result.text == "built k"
    assert invocations(tmp_path)["ttl 86400000"] == 1 and "plain k" not in invocations(tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("end", ["cancelled", "input_required"])
async def test_a_task_that_ends_cancelled_or_wants_input_is_a_failure_below_the_tool(tmp_path: Path, end: str) -> None:
    (tmp_path / "done").touch()
    contract = _task_contract(tmp_path, TASK_END=end)
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=CLOCK) as mounts:
            task = await _build(mounts)
            assert task is not None
            with pytest.raises(ToolCallError) as info:
                await mounts.task_result(mounts.tools["mcp:tk:build"], task, timeout_s=30)
    assert (info.value.cause, info.value.retryable, info.value.task) == (f"task_{end}", False, "task-k")


@pytest.mark.anyio
async def test_a_serve_mcp_run_calls_a_task_tool_as_a_task(tmp_path: Path) -> None:
    from truss.mcp._serve_backend import LedgerBackend
    from truss.mcp._serve_core import Principal

    (tmp_path / "done").touch()
    store, key = new_store(tmp_path)
    backend = LedgerBackend(Runtime(home=tmp_path, store=store, key=key, clock=CLOCK, environ={}))
    contract = backend.load(_tasks_contract(tmp_path), {}, {})
    with anyio.fail_after(60):
        answer = await backend.run(contract, session_id="s1", principal=Principal("t", "u"), on_progress=lambda _: None)
    assert answer.status == "pass", answer
    recorded = list(store.read_session("s1"))
    [pending] = [e for e in recorded if e.kind == "mcp_tool_pending"]
    [result] = [e for e in recorded if e.kind == "mcp_tool_call"]
    assert pending.body["task"] == result.body["task"] == "task-k"
