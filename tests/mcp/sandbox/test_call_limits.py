"""The limit check after each call to a confined server, through ``connect`` and ``Mounts.call``.

A call during which the sandbox reached a kernel limit fails with ``sandbox_limit`` whatever the
server answered, also after many calls whose check found the counters unchanged (the check reads
them after every call and parses them only when they changed), and the call after it is not
blamed for it. A limit's own signal is recognised after checks that read bwrap's status while the
sandbox ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from tests.mcp.sandbox._util import SERVERS, checked_bwrap
from truss._clock import SystemClock
from truss._errors import ToolCallError
from truss.contract import load_contract_text
from truss.mcp.client import connect
from truss.mcp.sandbox import Limits, Profile, confined
from truss.mcp.sandbox._cgroup import setup_cgroups

pytestmark = pytest.mark.anyio

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"}


def _pids_cgroup_writable(name: str) -> bool:
    groups, _ = setup_cgroups(f"truss-probe-{name}", Limits(processes=16))
    try:
        return "pids" in groups.dirs
    finally:
        groups.remove()


def _contract(processes: int) -> str:
    return f"""
[contract]
name = "forks"
intent = "a server that reaches its processes limit on demand"
[[mcp.servers]]
name = "forks"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(SERVERS / "forks.py"))}]
allow_tools = ["idle", "fork"]
connect_timeout = "60s"
[mcp.servers.sandbox]
limits = {{ processes = {processes} }}
"""


async def test_a_call_that_reaches_the_processes_limit_after_calls_that_did_not_fails_as_sandbox_limit(
    tmp_path: Path,
) -> None:
    await checked_bwrap()
    if not _pids_cgroup_writable(tmp_path.name):
        message = "no pids cgroup is writable here: only an rlimit stops the forks, and nothing counts them"
        if os.environ.get("CI"):  # CI runs as root, where the cgroup is writable: a skip there would hide a regression
            pytest.fail(message)
        pytest.skip(message)
    contract = load_contract_text(_contract(16), source="forks.toml")
    failures: list[ToolCallError] = []
    answers: list[str] = []
    with anyio.fail_after(120):
        async with connect(contract, log_dir=tmp_path, clock=SystemClock(), environ=ENV) as mounts:
            idle, fork = mounts.tools["mcp:forks:idle"], mounts.tools["mcp:forks:fork"]
            for tool in (idle, idle, idle, idle, idle, fork, idle, idle, fork, idle):
                try:
                    result = await mounts.call(tool, {}, timeout_s=60)
                except ToolCallError as exc:
                    failures.append(exc)
                    answers.append("failed")
                else:
                    answers.append(str(result.wire["content"][0]["text"]))
    assert answers == ["idle"] * 5 + ["failed"] + ["idle"] * 2 + ["failed", "idle"]
    first, second = (f.fields for f in failures)
    assert (first["cause"], first["limit"]) == ("sandbox_limit", "processes")
    assert (second["cause"], second["limit"]) == ("sandbox_limit", "processes")
    assert first["evidence"] != second["evidence"]  # the counter grew: the second hit is a new one


async def test_a_cpu_limit_signal_is_recognised_after_checks_made_while_the_sandbox_ran() -> None:
    await checked_bwrap()
    code = "import sys\nsys.stdin.readline()\nwhile True:\n    pass\n"
    profile = Profile(limits=Limits(cpu_s=1))
    async with confined(profile, sys.executable, ["-c", code], ENV, "/", server="spin") as spawn:
        process = await anyio.open_process([spawn.command, *spawn.args], env=spawn.env)
        async with process:
            with anyio.fail_after(60):
                while "child-pid" not in spawn.status():  # noqa: ASYNC110 - bwrap reports its start in a file
                    await anyio.sleep(0.01)
                for _ in range(5):  # checks of a running sandbox: its status read and remembered
                    assert spawn.limit_hits() == []
                assert process.stdin is not None
                await process.stdin.send(b"spin\n")
                status = await process.wait()
            hits = spawn.limit_hits()
    assert status == 128 + 24  # SIGXCPU, as the supervisor reports it through bwrap
    assert [h.limit for h in hits] == ["cpu"]
