"""Support of the security tests: the CLI as a subprocess, a fresh home, a hostile server's contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, truss_cmd

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "servers" / "hostile.py"
DATA = HERE / "data"
TIMEOUT = 60


def truss(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``truss ARGS`` as a user runs it, with ``TRUSS_HOME=home`` and only the variables given."""
    environ = {"PATH": "/usr/bin:/bin", "TRUSS_HOME": str(home), "PYTHONUTF8": "1", **(env or {})}
    return subprocess.run(
        [*truss_cmd(), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=environ,
        cwd=REPO,
        timeout=TIMEOUT,
        check=False,
    )


# These contracts test that a run survives an attack and records it, not what its verdict is: they
# have no done checks and say so, so the run ends pass (exit 0) whatever its calls did.
PASS_WHATEVER = "[done]\npass_without_checks = true\n"


def hostile_contract(tmp_path: Path, *, agent: str = "", server_extra: str = "", name: str = "hostile") -> Path:
    """A contract around ``servers/hostile.py``; ``agent`` is the ``[agent]`` part (steps by default)."""
    agent = agent or '[[agent.steps]]\ntool = "mcp:hostile:echo"\narguments = { text = "hi" }\n'
    text = f"""
[contract]
name = "{name}"
intent = "security test"
{agent}
[[mcp.servers]]
name = "hostile"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(HOSTILE))}]
allow_tools = ["echo"]
connect_timeout = "20s"
{server_extra}
{PASS_WHATEVER}"""
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def unsafe_characters(text: str) -> list[str]:
    """Characters a terminal would obey rather than show (everything non-printable but newline, tab)."""
    return sorted({repr(c) for c in text if not c.isprintable() and c not in "\n\t"})
