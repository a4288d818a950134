"""Third-party servers run confined through ``truss run`` with the real bwrap, with no hand-written binds.

mcp-server-time (the demo contract), mcp-server-git with the repository bound read-only (the
git-triage contract), server-filesystem with one directory bound writable, server-everything.
Each run passes, records the sandbox in ``session_started``, and its ledger verifies.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import PEERS, REPO, node_peer, peers_path_env, python_peer, truss_cmd
from tests.mcp.sandbox._util import checked_bwrap
from truss.ledger.keys import IdentityKey

TIMEOUT = 180
SANDBOX = '\n[mcp.servers.sandbox]\nlimits = { memory = "1G", processes = 256 }\n'


def _truss(home: Path, *args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> Any:
    environ = {**peers_path_env(), "TRUSS_HOME": str(home), **(env or {})}
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=TIMEOUT, check=False
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    anyio.run(checked_bwrap)
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    IdentityKey.create(path / "identity.key")
    return path


def _passes_confined(
    home: Path, contract: Path, *, env: dict[str, str] | None = None, cwd: Path = REPO
) -> dict[str, Any]:
    run = _truss(home, "--json", "run", str(contract), "--session", "confined", env=env, cwd=cwd)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["status"] == "pass"
    shown = _truss(home, "--json", "ledger", "show", "confined", "--no-payloads")
    started: dict[str, Any] = json.loads(shown.stdout)["entries"][0]["entry"]["body"]
    assert all(s["launcher"]["kind"] == "sandbox" for s in started["servers"].values())
    verify = _truss(home, "ledger", "verify", "confined")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return started


def _filesystem_peer() -> list[str]:
    """server-filesystem, installed by ``make peers`` beside server-everything's Node."""
    script = PEERS / "node-fs" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
    node = node_peer("server-everything")[0]
    if not script.exists():
        message = "@modelcontextprotocol/server-filesystem is not installed: run make peers"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [node, str(script)]


@pytest.mark.peers
def test_mcp_server_time_passes_the_demo_contract_confined(home: Path, tmp_path: Path) -> None:
    python_peer("mcp-server-time")
    contract = tmp_path / "hello.toml"
    contract.write_text((REPO / "contracts" / "hello.toml").read_text(encoding="utf-8") + SANDBOX, encoding="utf-8")
    started = _passes_confined(home, contract)
    assert started["servers"]["time"]["launcher"]["sandbox"]["network"] == "none"


@pytest.mark.peers
def test_mcp_server_git_passes_git_triage_with_the_repository_bound_read_only(home: Path, tmp_path: Path) -> None:
    python_peer("mcp-server-git")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True, timeout=30)
    (repo / "notes.txt").write_text("one\n")
    subprocess.run([*git, "add", "notes.txt"], cwd=repo, check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "first"], cwd=repo, check=True, timeout=30)
    (repo / "notes.txt").write_text("one\ntwo\n")
    contract = tmp_path / "git-triage.toml"
    table = f"\n[mcp.servers.sandbox]\nread = [{json.dumps(str(repo))}]\n"
    contract.write_text((REPO / "contracts" / "git-triage.toml").read_text(encoding="utf-8") + table, encoding="utf-8")
    started = _passes_confined(home, contract, env={"REPO": str(repo)}, cwd=repo)
    binds = started["servers"]["git"]["launcher"]["sandbox"]["binds"]
    assert {"path": str(repo), "mode": "ro", "why": "profile"} in binds


@pytest.mark.peers
def test_server_filesystem_writes_only_into_its_one_writable_directory(home: Path, tmp_path: Path) -> None:
    node, script = _filesystem_peer()
    work = tmp_path / "work"
    work.mkdir()
    target = work / "note.txt"
    contract = tmp_path / "files.toml"
    contract.write_text(
        f"""
[contract]
name = "files"
intent = "write and read back one file"
[agent]
provider = "scripted"
final = "done"
[[agent.steps]]
tool = "mcp:files:write_file"
arguments = {{ path = {json.dumps(str(target))}, content = "written inside the sandbox" }}
[[agent.steps]]
tool = "mcp:files:read_text_file"
arguments = {{ path = {json.dumps(str(target))} }}
[policy]
default = "allow"
[[mcp.servers]]
name = "files"
command = {json.dumps(node)}
args = [{json.dumps(script)}, {json.dumps(str(work))}]
allow_tools = ["write_file", "read_text_file"]
connect_timeout = "60s"
[mcp.servers.sandbox]
write = [{json.dumps(str(work))}]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:files:read_text_file"
""",
        encoding="utf-8",
    )
    _passes_confined(home, contract)
    assert target.read_text(encoding="utf-8") == "written inside the sandbox"


@pytest.mark.peers
def test_server_everything_passes_a_call_confined(home: Path, tmp_path: Path) -> None:
    node, script = node_peer("server-everything")
    contract = tmp_path / "everything.toml"
    contract.write_text(
        f"""
[contract]
name = "everything"
intent = "one echo through a confined server-everything"
[agent]
provider = "scripted"
final = "done"
[[agent.steps]]
tool = "mcp:everything:echo"
arguments = {{ message = "confined" }}
[policy]
default = "allow"
[[mcp.servers]]
name = "everything"
command = {json.dumps(node)}
args = [{json.dumps(script)}, "stdio"]
allow_tools = ["echo"]
connect_timeout = "60s"
{SANDBOX}
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:everything:echo"
""",
        encoding="utf-8",
    )
    _passes_confined(home, contract)
