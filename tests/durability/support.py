"""Helpers for the durability tests: the CLI as a subprocess, a counting server contract, the record."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tests.conftest import REPO, truss_cmd
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store

COUNTING = Path(__file__).resolve().parent / "servers" / "counting.py"
TIMEOUT = 120  # generous: the CI machine may be loaded; never reached when things work


def truss(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    environ = dict(os.environ)
    environ.pop("TRUSS_FAULT", None)
    environ["TRUSS_HOME"] = str(home)
    environ.update(env or {})
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=TIMEOUT, check=False
    )


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``truss`` run in this process (the CLI's own entry point, output captured): for the commands
    that connect nothing (verify, resolve, signal, replay), where a new interpreter per call would
    only add start-up time. Not thread-safe (it redirects stdout): call it from one thread."""
    import contextlib
    import io

    from truss_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(home), *args])
    return subprocess.CompletedProcess(["truss", *args], code, out.getvalue(), err.getvalue())


def make_home(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    IdentityKey.create(path / "identity.key")
    return path


def long_counting_contract(directory: Path, steps: int) -> Path:
    """``counting_contract`` with ``steps`` calls of ``mcp:cnt:count`` (keys k0, k1, ...) and budgets
    and a deadline that let all of them run: a long session to resume."""
    return counting_contract(
        directory,
        steps=[("mcp:cnt:count", {"key": f"k{i}"}) for i in range(steps)],
        check_tool="mcp:cnt:count",
        contract=f"[budget]\nmax_tool_calls = {steps + 5}\nmax_model_turns = {steps + 5}\n"
        f'deadline = "1h"\n[agent]\nmax_turns = {steps + 5}\n',
    )


def counting_contract(
    directory: Path,
    *,
    steps: list[tuple[str, dict[str, Any]]],
    check_tool: str,
    name: str = "durable",
    server: str = "",
    contract: str = "",
) -> Path:
    """A contract whose plan calls the counting server's tools; invocations go to ``directory/count.txt``."""
    plan = "".join(
        f"[[agent.steps]]\ntool = {json.dumps(tool)}\narguments = {_inline(arguments)}\n" for tool, arguments in steps
    )
    text = f"""
[contract]
name = "{name}"
intent = "count invocations"
{contract}
{plan}
[[mcp.servers]]
name = "cnt"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(COUNTING))}]
env = {{ COUNT_FILE = {json.dumps(str(directory / "count.txt"))} }}
allow_tools = ["count", "other", "deploy"]
retry_in_doubt = ["other"]
connect_timeout = "60s"
{server}
[[done.checks]]
kind = "tool_succeeded"
tool = {json.dumps(check_tool)}
"""
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _inline(arguments: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in arguments.items()) + " }"


def invocations(directory: Path) -> Counter[str]:
    """How often each ``<tool> <key>`` reached the server (its durable count file)."""
    path = directory / "count.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return Counter(lines)


def kinds(home: Path, session: str) -> list[str]:
    """The kinds of a session's entries, in order, read from the store itself."""
    return [e.kind for e in entries(home, session)]


def entries(home: Path, session: str) -> list[Any]:
    key = IdentityKey.load(home / "identity.key")
    store = open_store(home / "ledger.db", key=key, clock=SystemClock())
    try:
        return list(store.read_session(session))
    finally:
        store.close()
