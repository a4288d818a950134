"""Real sessions for the report tests, made the way a user makes them: ``truss run`` as a subprocess.

``make_sessions(home, work)`` runs, against the wire-level test servers (``tests/e2e/servers/tools.py``
and ``tests/durability/servers/counting.py``):

- ``pass``: an echo whose result holds ``<script>`` and ``<img onerror>``, a final answer with a
  ``<script>`` of its own; verdict pass;
- ``denied``: a call the policy denies, so the ``no_denials`` check fails; verdict fail;
- ``approval``: a write that needs approval: the run suspends (exit 3), ``truss approve``, ``truss
  resume`` finishes it; verdict pass;
- ``waiting``: the same contract, suspended and never approved;
- ``signal``: a deploy whose result arrives later: the run suspends until ``truss signal``, then
  ``truss resume``; verdict pass;
- ``doubt``: a run killed after a call's intent (``TRUSS_FAULT``), resumed into ``in_doubt``,
  answered with ``truss resolve``, resumed to the end;
- ``memo-a``/``memo-b``: the second answers its call from the first's record (cross-run memo).

Each step asserts its exit code, so a broken run fails where it broke.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.conftest import REPO, truss_cmd

TOOLS = REPO / "tests" / "e2e" / "servers" / "tools.py"
COUNTING = REPO / "tests" / "durability" / "servers" / "counting.py"
TIMEOUT = 120

SCRIPT_RESULT = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
SCRIPT_FINAL = "<script>document.title='model'</script> done"


def truss(
    home: Path, *args: str, env: Mapping[str, str] | None = None, expect: int | None = 0
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.pop("TRUSS_FAULT", None)
    environ["TRUSS_HOME"] = str(home)
    environ.update(env or {})
    done = subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=TIMEOUT, check=False
    )
    if expect is not None:
        assert done.returncode == expect, f"truss {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _tools_contract(work: Path, name: str, body: str) -> Path:
    path = work / f"{name}.toml"
    path.write_text(
        f"""
[contract]
name = "{name}"
intent = "report test"
{body}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS))}]
allow_tools = ["echo", "slow", "write", "has_env"]
connect_timeout = "60s"
""",
        encoding="utf-8",
    )
    return path


def _counting_contract(work: Path, name: str, body: str, server: str = "") -> Path:
    path = work / f"{name}.toml"
    path.write_text(
        f"""
[contract]
name = "{name}"
intent = "report test"
{body}
[[mcp.servers]]
name = "cnt"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(COUNTING))}]
env = {{ COUNT_FILE = {json.dumps(str(work / f"{name}.count"))} }}
allow_tools = ["count", "other", "deploy"]
connect_timeout = "60s"
{server}
""",
        encoding="utf-8",
    )
    return path


PASS = f"""
[agent]
final = {json.dumps(SCRIPT_FINAL)}
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = {{ text = {json.dumps(SCRIPT_RESULT)} }}
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:echo"
[[done.checks]]
kind = "result_matches"
tool = "mcp:tools:echo"
pointer = "/text"
regex = "onerror"
"""

DENIED = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "hello" }
[[agent.steps]]
tool = "mcp:tools:has_env"
arguments = { name = "HOME" }
[[policy.rules]]
tool = "mcp:tools:has_env"
effect = "deny"
reason = "no probing of the environment"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:echo"
[[done.checks]]
kind = "no_denials"
"""

APPROVAL = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "before" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "out.txt", text = "hello" }
[[policy.rules]]
tool = "mcp:tools:write"
effect = "ask"
reason = "writes need a person"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:write"
"""

SIGNAL = """
[agent]
final = "deployed"
[[agent.steps]]
tool = "mcp:cnt:deploy"
arguments = { name = "web" }
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:cnt:deploy"
"""
SIGNAL_SERVER = """
[[mcp.servers.async]]
tool = "deploy"
pending = { pointer = "/status", equals = "pending" }
signal = "/job"
"""

DOUBT = """
[agent]
final = "counted"
[[agent.steps]]
tool = "mcp:cnt:count"
arguments = { key = "k1" }
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:cnt:count"
"""

MEMO = """
[agent]
final = "counted"
[[agent.steps]]
tool = "mcp:cnt:count"
arguments = { key = "m" }
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:cnt:count"
"""
MEMO_SERVER = """
[[mcp.servers.tools]]
name = "count"
memo = "1h"
"""


def make_sessions(home: Path, work: Path) -> dict[str, str]:
    """Run every session of the module docstring into ``home``; returns name -> session id."""
    truss(home, "init")
    truss(home, "run", str(_tools_contract(work, "pass", PASS)), "--session", "pass")
    truss(home, "run", str(_tools_contract(work, "denied", DENIED)), "--session", "denied", expect=1)

    approval = _tools_contract(work, "approval", APPROVAL)
    truss(home, "run", str(approval), "--session", "approval", expect=3)
    truss(home, "approve", "approval", "c2.0", "--reason", "checked by hand")
    truss(home, "resume", "approval")
    truss(home, "run", str(approval), "--session", "waiting", expect=3)

    signal = _counting_contract(work, "signal", SIGNAL, SIGNAL_SERVER)
    truss(home, "run", str(signal), "--session", "signal", expect=3)
    payload = json.dumps({"status": "done", "url": "https://web.example"})
    truss(home, "signal", "signal", "job-web", "--payload", payload)
    truss(home, "resume", "signal")

    doubt = _counting_contract(work, "doubt", DOUBT)
    truss(home, "run", str(doubt), "--session", "doubt", env={"TRUSS_FAULT": "after_intent"}, expect=None)
    truss(home, "resume", "doubt", expect=3)
    truss(home, "resolve", "doubt", "c1.0", "--result", json.dumps("counted k1 (checked by hand)"))
    truss(home, "resume", "doubt")

    memo = _counting_contract(work, "memo", MEMO, MEMO_SERVER)
    truss(home, "run", str(memo), "--session", "memo-a")
    truss(home, "run", str(memo), "--session", "memo-b")
    return {name: name for name in ("pass", "denied", "approval", "waiting", "signal", "doubt", "memo-a", "memo-b")}
