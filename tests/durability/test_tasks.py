"""MCP Tasks: a task-augmented call records ``mcp_tool_pending`` with the task id; a run that stops
(a crash, a call timeout) resumes by polling the *same* task; a task the server no longer knows is
in doubt. Against server-everything's ``simulate-research-query`` (npm) and ``servers/tasks.py``,
whose tasks live in a file and so outlive a server process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import node_peer
from tests.durability.support import cli, entries, invocations, kinds, make_home, truss

TASKS_SERVER = Path(__file__).resolve().parent / "servers" / "tasks.py"


def _tasks_contract(directory: Path, *, call_timeout: str = "60s") -> Path:
    env = {
        "COUNT_FILE": str(directory / "count.txt"),
        "TASK_FILE": str(directory / "tasks.json"),
        "TASK_DONE_FILE": str(directory / "done"),
    }
    path = directory / "tasks.toml"
    path.write_text(
        f"""
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
""",
        encoding="utf-8",
    )
    return path


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
