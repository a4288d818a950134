"""Confined servers through ``truss run`` (a subprocess, as a user runs it) with the real bwrap.

The hostile server of ``servers/escape.py`` runs under a contract's ``[mcp.servers.sandbox]``:
every attempt fails, the canary appears nowhere under ``$TRUSS_HOME`` or in the output, the
refused connections are signed ``sandbox_egress`` entries, a limit hit inside a call is a
``sandbox_limit`` failure, the run reaches its verdict, no process survives and the ledger
verifies. A ``required`` sandbox where bwrap cannot run refuses to start, naming cause and remedy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import REPO, peers_path_env, python_peer, truss_cmd
from tests.durability.support import counting_contract, invocations, make_home
from tests.durability.support import entries as stored_entries
from tests.durability.support import truss as durable_truss
from tests.gate.support import files_containing
from tests.mcp.sandbox._util import SERVERS, checked_bwrap, processes_with
from truss.ledger.keys import IdentityKey

CANARY = "CANARY-5c1d0e77-never-recorded"
MEMORY = 256 * 1024 * 1024
FILE_SIZE = 8 * 1024 * 1024
PROCESSES = 32
TIMEOUT = 120
BLOCKED = [
    "read_ssh_canary",
    "list_ssh_dir",
    "read_identity_key",
    "read_ledger",
    "write_read_only_bind",
    "write_etc",
    "write_root",
    "connect_refused_port_direct",
    "connect_refused_port_via_proxy",
    "reach_trusss_control_socket",
    "resolve_other_host",
    "reach_other_host_via_proxy",
    "fork_many",
    "allocate_past_memory",
    "write_past_file_size",
    "see_host_process",
]


def _truss(home: Path, user: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = peers_path_env()
    environ.update({"TRUSS_HOME": str(home), "HOME": str(user), **(env or {})})
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=TIMEOUT, check=False
    )


def _entries(home: Path, user: Path, session: str) -> list[dict[str, Any]]:
    shown = _truss(home, user, "--json", "ledger", "show", session, "--full")
    assert shown.returncode == 0, shown.stderr
    doc: dict[str, Any] = json.loads(shown.stdout)
    entries: list[dict[str, Any]] = doc["entries"]
    return entries


def _body(entry: dict[str, Any]) -> dict[str, Any]:
    return entry["entry"]["body"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One confined hostile run through ``truss run`` answers every test below."""
    anyio.run(checked_bwrap)
    root = tmp_path_factory.mktemp("hostile")
    shared = root / "shared"  # bound read-only: it holds Truss's home, which must stay hidden
    home = shared / "truss-home"
    user = root / "user"
    work = root / "work"
    for d in (home, user / ".ssh", work):
        d.mkdir(parents=True)
    home.chmod(0o700)
    IdentityKey.create(home / "identity.key")
    (user / ".ssh" / "id_canary").write_text(CANARY)
    refused_port, allowed_port = 9, 7  # nothing listens: the proxy refuses one and fails the other
    marker = f"escape-run-{os.getpid()}"
    config = {
        "ssh_canary": str(user / ".ssh" / "id_canary"),
        "identity_key": str(home / "identity.key"),
        "ledger": str(home / "ledger.db"),
        "truss_home": str(home),
        "read_dir": str(shared),
        "write_dir": str(work),
        "outside_file": str(root / "outside.txt"),
        "refused_port": refused_port,
        "allowed_port": allowed_port,
        "other_host": "example.com",
        "fork": 10_000,
        "allocate": 2 * MEMORY,
        "big_file": 4 * FILE_SIZE,
        "host_pid": os.getpid(),
    }
    contract = root / "hostile.toml"
    contract.write_text(
        f"""
[contract]
name = "hostile"
intent = "a hostile server under a sandbox"

[agent]
provider = "scripted"
final = "done"
[[agent.steps]]
tool = "mcp:escape:startup_report"
arguments = {{}}
[[agent.steps]]
tool = "mcp:escape:attack"
arguments = {{}}

[policy]
default = "allow"

[[mcp.servers]]
name = "escape"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(SERVERS / "escape.py"))}, {json.dumps(json.dumps(config))}]
env = {{ ESCAPE_MARK = {json.dumps(marker)} }}
allow_tools = ["startup_report", "attack"]
connect_timeout = "60s"
call_timeout = "60s"
[mcp.servers.sandbox]
read = [{json.dumps(str(shared))}]
write = [{json.dumps(str(work))}]
network = "allow"
allow_hosts = ["127.0.0.1:{allowed_port}"]
limits = {{ memory = {MEMORY}, processes = {PROCESSES}, cpu = "60s", file_size = {FILE_SIZE} }}

[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:escape:startup_report"
""",
        encoding="utf-8",
    )
    run = _truss(home, user, "--json", "run", str(contract), "--session", "hostile")
    return {
        "run": run,
        "home": home,
        "user": user,
        "work": work,
        "shared": shared,
        "root": root,
        "marker": marker,
        "survivors": processes_with(marker.encode()),
        "ports": (refused_port, allowed_port),
        "entries": _entries(home, user, "hostile"),
    }


def test_the_confined_hostile_run_reaches_its_verdict(hostile: dict[str, Any]) -> None:
    run = hostile["run"]
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["status"] == "pass"
    assert "Traceback" not in run.stderr


def test_every_escape_attempt_at_start_up_fails(hostile: dict[str, Any]) -> None:
    [first] = [e for e in hostile["entries"] if e["kind"] == "mcp_tool_call" and _body(e)["call"] == "c1.0"]
    result = first["payloads"][_body(first)["result"]]["value"]
    report = json.loads(result["content"][0]["text"])
    leaked = {name: report[name] for name in BLOCKED if not report[name]["blocked"]}
    assert not leaked
    assert report["network_interfaces"]["got"] == ["lo"]


def test_the_canary_appears_nowhere_under_truss_home_or_in_the_output(hostile: dict[str, Any]) -> None:
    run = hostile["run"]
    assert CANARY not in run.stdout + run.stderr
    assert files_containing(hostile["home"], CANARY.encode()) == []
    key = (hostile["home"] / "identity.key").read_bytes()
    assert files_containing(hostile["home"] / "logs", key) == []


def test_refused_connections_are_signed_sandbox_egress_entries_after_session_started(
    hostile: dict[str, Any],
) -> None:
    refused_port, _ = hostile["ports"]
    entries = hostile["entries"]
    egress = [(e["seq"], _body(e)) for e in entries if e["kind"] == "sandbox_egress"]
    refused = [(b["host"], b["port"]) for _, b in egress if b["decision"] == "refused"]
    # At start-up (appended right after session_started) and again inside the attack call.
    assert refused.count(("127.0.0.1", refused_port)) == 2
    assert refused.count(("example.com", 443)) == 2
    assert all(b["server"] == "escape" and "bytes_up" in b and "duration_ms" in b for _, b in egress)
    first_call = next(e["seq"] for e in entries if e["kind"] == "mcp_tool_intent")
    assert [b["host"] for s, b in egress if s < first_call].count("example.com") == 1


def test_the_sandbox_profile_is_recorded_in_session_started(hostile: dict[str, Any]) -> None:
    started = _body(hostile["entries"][0])
    launcher = started["servers"]["escape"]["launcher"]
    assert launcher["kind"] == "sandbox"
    assert launcher["sandbox"]["network"] == "allow"
    assert str(hostile["home"]) in launcher["sandbox"]["masked"]


def test_a_limit_hit_inside_a_call_fails_it_as_sandbox_limit_where_cgroups_count_it(hostile: dict[str, Any]) -> None:
    entries = hostile["entries"]
    [attack] = [_body(e) for e in entries if e["kind"] == "mcp_tool_call" and _body(e)["tool"] == "mcp:escape:attack"]
    started = _body(entries[0])["servers"]["escape"]["launcher"]["sandbox"]
    if "failure" in attack:
        assert attack["failure"]["cause"] == "sandbox_limit"
        assert attack["failure"]["limit"] in {"processes", "memory", "file_size", "cpu"}
        assert attack["failure"]["evidence"]
    else:
        # Only rlimits: the server survived every hit and no counter shows it.
        assert not started.get("cgroups")


def test_no_process_of_the_sandbox_survives_the_run(hostile: dict[str, Any]) -> None:
    assert hostile["survivors"] == []


def test_the_ledger_of_the_confined_run_verifies(hostile: dict[str, Any]) -> None:
    verify = _truss(hostile["home"], hostile["user"], "ledger", "verify", "hostile")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_required_sandbox_where_bwrap_cannot_run_refuses_to_start_naming_cause_and_remedy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    IdentityKey.create(home / "identity.key")
    fake = tmp_path / "bwrap"
    # Answers like bubblewrap, but cannot build a namespace: user namespaces are not allowed here.
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
        "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    contract = tmp_path / "c.toml"
    text = (REPO / "contracts" / "hello.toml").read_text(encoding="utf-8")
    contract.write_text(text + "\n[mcp.servers.sandbox]\nrequired = true\n", encoding="utf-8")
    python_peer("mcp-server-time")
    run = _truss(home, tmp_path, "run", str(contract), env={"TRUSS_BWRAP": str(fake)})
    assert run.returncode == 4, run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert "Traceback" not in out
    assert "bubblewrap cannot create namespaces here" in out  # the cause
    assert "Allow unprivileged user namespaces" in out  # the remedy
    assert files_containing(home / "logs", b"mcp-time") == []  # the server itself never ran


def test_a_result_memoized_unconfined_never_answers_a_confined_call(tmp_path: Path) -> None:
    anyio.run(checked_bwrap)
    home = make_home(tmp_path / "home")
    memo = '[[mcp.servers.tools]]\nname = "count"\nmemo = "1h"\n'
    confined = memo + f"[mcp.servers.sandbox]\nwrite = [{json.dumps(str(tmp_path))}]\n"

    def contract(server: str) -> str:
        steps = [("mcp:cnt:count", {"key": "k"})]
        return str(counting_contract(tmp_path, steps=steps, check_tool="mcp:cnt:count", server=server))

    assert durable_truss(home, "run", contract(memo), "--session", "plain").returncode == 0
    run = durable_truss(home, "run", contract(confined), "--session", "confined")
    assert run.returncode == 0, run.stdout + run.stderr
    assert invocations(tmp_path) == {"count k": 2}  # the unconfined result did not answer
    [call] = [e for e in stored_entries(home, "confined") if e.kind == "mcp_tool_call"]
    assert "replayed_from" not in call.body
    # The same confined call again is answered from the confined run's result.
    again = durable_truss(home, "run", contract(confined), "--session", "again")
    assert again.returncode == 0, again.stdout + again.stderr
    assert invocations(tmp_path) == {"count k": 2}
    [hit] = [e for e in stored_entries(home, "again") if e.kind == "mcp_tool_call"]
    assert hit.body["replayed_from"]["session"] == "confined"


APPROVAL = """
[agent]
provider = "scripted"
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "before" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "out.txt", text = "hello" }
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:tools:write"
effect = "ask"
reason = "writes need a person"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:write"
"""


def test_a_resumed_run_whose_sandbox_changed_diverges_instead_of_running_under_other_confinement(
    tmp_path: Path,
) -> None:
    bwrap = anyio.run(checked_bwrap)
    home = make_home(tmp_path / "home")
    contract = tmp_path / "approve.toml"
    tools = REPO / "tests" / "e2e" / "servers" / "tools.py"
    contract.write_text(
        '[contract]\nname = "approve"\nintent = "a confined run that waits for a person"\n'
        + APPROVAL
        + f'[[mcp.servers]]\nname = "tools"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(tools))}]\nallow_tools = ["echo", "write"]\nconnect_timeout = "60s"\n'
        "[mcp.servers.sandbox]\n",
        encoding="utf-8",
    )
    first = durable_truss(home, "run", str(contract), "--session", "moved")
    assert first.returncode == 3, first.stdout + first.stderr
    assert durable_truss(home, "approve", "moved", "c2.0").returncode == 0
    # The same bubblewrap under another version: the sandbox it builds is described differently.
    other = tmp_path / "bwrap"
    other.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "bubblewrap 9.9.9"; exit 0; fi\nexec {bwrap.path} "$@"\n'
    )
    other.chmod(0o755)
    resumed = durable_truss(home, "resume", "moved", env={"TRUSS_BWRAP": str(other)})
    assert resumed.returncode == 4, resumed.stdout + resumed.stderr
    assert "launcher description changed" in resumed.stdout + resumed.stderr
    recorded = stored_entries(home, "moved")
    assert recorded[-1].kind == "session_suspended" and recorded[-1].body["reason"] == "diverged"
    assert "mcp_tool_call" not in [e.kind for e in recorded if e.body.get("call") == "c2.0"]
