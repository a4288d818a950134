"""A hostile stdio server, confined by a real bwrap, tries to escape at start-up and inside a call.

Driven through ``confined`` and the MCP SDK's stdio client (part 2 drives it through ``truss
run``). Every attempt must fail, the canary must appear nowhere, refused connections must be
reported as events, and no process of the sandbox may outlive it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from tests.mcp.sandbox._util import SERVERS, answering_listener, checked_bwrap, processes_with
from truss._clock import SystemClock
from truss._errors import SandboxError
from truss.mcp.sandbox import EgressEvent, Limits, Profile, SandboxEvent, confined, parse_host_rule

pytestmark = pytest.mark.anyio

CANARY = "CANARY-7f3e9b1c-do-not-leak"
SECRET = "s3cret-token-value-4d2a"
MEMORY = 256 * 1024 * 1024
FILE_SIZE = 8 * 1024 * 1024
PROCESSES = 32


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def _layout(tmp_path: Path) -> dict[str, Path]:
    shared = tmp_path / "shared"  # bound read-only: it holds Truss's home, which must stay hidden
    home = shared / "truss-home"
    fake_user = tmp_path / "user"
    work = tmp_path / "work"
    for d in (home, fake_user / ".ssh", work):
        d.mkdir(parents=True)
    (fake_user / ".ssh" / "id_canary").write_text(CANARY)
    (home / "identity.key").write_text(CANARY)
    (home / "ledger.db").write_text(CANARY)
    (shared / "readme.txt").write_text("shared data")
    return {"shared": shared, "home": home, "user": fake_user, "work": work, "outside": tmp_path / "outside.txt"}


async def _run_escape(tmp_path: Path) -> dict[str, Any]:
    await checked_bwrap()
    paths = _layout(tmp_path)
    events: list[SandboxEvent] = []
    marker = f"escape-{os.getpid()}-{tmp_path.name}"
    async with answering_listener(b"not for you\n") as refused_port, answering_listener(b"hi\n") as allowed_port:
        config = {
            "ssh_canary": str(paths["user"] / ".ssh" / "id_canary"),
            "identity_key": str(paths["home"] / "identity.key"),
            "ledger": str(paths["home"] / "ledger.db"),
            "truss_home": str(paths["home"]),
            "read_dir": str(paths["shared"]),
            "write_dir": str(paths["work"]),
            "outside_file": str(paths["outside"]),
            "refused_port": refused_port,
            "allowed_port": allowed_port,
            "other_host": "example.com",
            "fork": 10_000,
            "allocate": 2 * MEMORY,
            "big_file": 4 * FILE_SIZE,
            "host_pid": os.getpid(),
        }
        profile = Profile(
            read=(str(paths["shared"]),),
            write=(str(paths["work"]),),
            network="allow",
            allow_hosts=(parse_host_rule(f"127.0.0.1:{allowed_port}"),),
            limits=Limits(memory=MEMORY, processes=PROCESSES, cpu_s=60, file_size=FILE_SIZE),
        )
        env = {"PATH": "/usr/bin:/bin", "HOME": str(paths["user"]), "ESCAPE_MARK": marker, "SECRET_TOKEN": SECRET}
        stderr_path = tmp_path / "server.stderr"
        args = [str(SERVERS / "escape.py"), json.dumps(config)]
        out: dict[str, Any] = {"paths": paths, "events": events, "marker": marker, "stderr": stderr_path}
        with stderr_path.open("w") as errlog:
            async with confined(
                profile,
                sys.executable,
                args,
                env,
                str(tmp_path),
                server="escape",
                on_event=events.append,
                protected=[str(paths["home"]), str(paths["home"] / "identity.key"), str(paths["home"] / "ledger.db")],
                clock=SystemClock(),
            ) as spawn:
                params = StdioServerParameters(command=spawn.command, args=spawn.args, env=spawn.env, cwd=spawn.cwd)
                with anyio.fail_after(60):
                    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                        await s.initialize()
                        startup = await s.call_tool("startup_report", {})
                        during = await s.call_tool("attack", {})
                        out["running_with_secret_on_cmdline"] = processes_with(SECRET.encode(), where="cmdline")
                        out["alive_while_running"] = processes_with(marker.encode())
                        out["hits"] = spawn.limit_hits()
                out["description"] = spawn.description
        out["survivors"] = processes_with(marker.encode())
        out["reports"] = {"startup": json.loads(_text(startup)), "call": json.loads(_text(during))}
        out["raw"] = _text(startup) + _text(during)
        out["ports"] = (refused_port, allowed_port)
        return out


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def escape(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # One hostile run (about two seconds) answers every test below.
    return await _run_escape(tmp_path_factory.mktemp("escape"))


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


@pytest.mark.parametrize("phase", ["startup", "call"])
async def test_every_escape_attempt_fails_at_start_up_and_inside_a_call(escape: dict[str, Any], phase: str) -> None:
    report = escape["reports"][phase]
    leaked = {name: report[name] for name in BLOCKED if not report[name]["blocked"]}
    assert not leaked
    home_listing = report["list_truss_home"]
    assert home_listing["blocked"] or home_listing["got"] == []
    assert report["network_interfaces"]["got"] == ["lo"]
    assert report["connect_allowed_port_via_proxy"] == {"blocked": False, "got": "hi\n"}
    assert report["write_allowed_dir"]["blocked"] is False


async def test_the_canary_and_the_secret_appear_nowhere_outside_the_server(escape: dict[str, Any]) -> None:
    assert CANARY not in escape["raw"]
    assert CANARY not in escape["stderr"].read_text()
    assert not any(CANARY in json.dumps(e.as_json()) for e in escape["events"])
    # The secret reached the server's environment, never a command line another user could read.
    assert escape["running_with_secret_on_cmdline"] == []


async def test_writes_land_only_in_the_write_bind_and_stop_at_file_size(escape: dict[str, Any]) -> None:
    paths = escape["paths"]
    assert (paths["work"] / "allowed.txt").read_text() == "escaped"
    assert not (paths["shared"] / "escaped.txt").exists()
    assert not paths["outside"].exists()
    assert (paths["work"] / "big.bin").stat().st_size <= FILE_SIZE


async def test_refused_and_allowed_connections_are_reported_as_events(escape: dict[str, Any]) -> None:
    refused_port, allowed_port = escape["ports"]
    events = [e for e in escape["events"] if isinstance(e, EgressEvent)]
    refused = [(e.host, e.port) for e in events if e.decision == "refused"]
    assert refused.count(("127.0.0.1", refused_port)) == 2  # at start-up and inside the call
    assert refused.count(("example.com", 443)) == 2
    allowed = [e for e in events if e.decision == "allowed"]
    assert [(e.host, e.port) for e in allowed] == [("127.0.0.1", allowed_port)] * 2
    assert all(e.bytes_up == len(b"hello\n") and e.bytes_down == len(b"hi\n") for e in allowed)
    assert all(e.reason == "not_allowed" for e in events if e.decision == "refused")


async def test_no_process_of_the_sandbox_survives_it_grandchildren_included(escape: dict[str, Any]) -> None:
    assert escape["reports"]["call"]["leave_grandchild"]["blocked"] is False
    assert escape["alive_while_running"]  # the scan does see sandbox processes while they run
    assert escape["survivors"] == []


async def test_the_fork_bomb_is_recognisable_as_a_processes_limit_hit_where_cgroups_exist(
    escape: dict[str, Any],
) -> None:
    detail = escape["reports"]["call"]["fork_many"]["detail"]
    assert int(detail.rsplit(" ", 2)[-2]) <= PROCESSES
    if "pids" in escape["description"]["cgroups"]:
        assert "processes" in {hit.limit for hit in escape["hits"]}
    else:
        assert escape["description"]["rlimits_only"]


async def test_the_description_records_binds_masks_network_and_limits(escape: dict[str, Any]) -> None:
    description = escape["description"]
    paths = escape["paths"]
    assert description["network"] == "allow"
    assert str(paths["home"]) in description["masked"]
    assert {"path": str(paths["work"]), "mode": "rw", "why": "profile"} in description["binds"]
    assert {"path": str(paths["shared"]), "mode": "ro", "why": "profile"} in description["binds"]
    assert description["limits"] == {"memory": MEMORY, "processes": PROCESSES, "cpu_s": 60, "file_size": FILE_SIZE}
    assert {"mount", "pid", "ipc", "uts", "net"} <= set(description["namespaces"])
    assert SECRET not in json.dumps(description)


def test_importing_the_hostile_server_runs_no_attack(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without its __main__ guard it would read its config from argv and attack this very host.
    monkeypatch.setattr(sys, "argv", ["escape.py"])
    spec = importlib.util.spec_from_file_location("escape_server", SERVERS / "escape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main) and capsys.readouterr() == ("", "")


def _ledger_outside_home(tmp_path: Path) -> dict[str, Path]:
    # [harness] db (or --db, TRUSS_DB) may keep the ledger anywhere: here in /srv/ledgers, not the home.
    home, ledgers, work = tmp_path / "truss-home", tmp_path / "srv" / "ledgers", tmp_path / "srv" / "work"
    for d in (home, ledgers, work):
        d.mkdir(parents=True)
    (home / "identity.key").write_text(CANARY)
    (ledgers / "ledger.db").write_text(CANARY)
    return {"home": home, "srv": tmp_path / "srv", "ledgers": ledgers, "work": work, "ledger": ledgers / "ledger.db"}


def _guarded(paths: dict[str, Path]) -> list[str]:
    db = str(paths["ledger"])  # what truss run protects: the home, the key, the ledger and its sidecars
    return [str(paths["home"]), str(paths["home"] / "identity.key"), db, f"{db}-wal", f"{db}-shm", f"{db}-journal"]


async def _plant(paths: dict[str, Path], *write: Path, sibling: Path | None = None) -> dict[str, str]:
    args = [str(SERVERS / "plant_journal.py"), str(paths["ledger"]), str(sibling or paths["work"])]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"}
    profile = Profile(write=tuple(map(str, write)))
    async with confined(profile, sys.executable, args, env, "/", server="plant", protected=_guarded(paths)) as spawn:
        with anyio.fail_after(60):
            done = await anyio.run_process([spawn.command, *spawn.args], env=spawn.env, cwd=spawn.cwd, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def _planted(paths: dict[str, Path]) -> list[str]:
    return sorted(p.name for p in paths["ledgers"].iterdir() if p.name not in ("ledger.db", "notes"))


async def test_a_server_that_may_write_above_a_ledger_outside_the_home_cannot_plant_a_journal_next_to_it(
    tmp_path: Path,
) -> None:
    # SQLite treats a hot LEDGER-journal as a rollback to apply at the next open: the ledger's
    # directory is hidden whole, so no sidecar made after the plan can appear on the host.
    await checked_bwrap()
    paths = _ledger_outside_home(tmp_path)
    report = await _plant(paths, paths["srv"])
    assert _planted(paths) == []
    assert report["move_directory"] != "moved" and paths["ledger"].read_text() == CANARY
    assert [report[s] for s in ("-journal", "-wal", "-shm")].count("created") == 0
    assert report["sibling"] == "created" and (paths["work"] / "allowed.txt").read_text() == "planted by the server"


async def test_a_server_whose_write_bind_is_the_ledgers_own_directory_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    await checked_bwrap()
    paths = _ledger_outside_home(tmp_path)
    with pytest.raises(SandboxError) as caught:
        await _plant(paths, paths["ledgers"])
    assert caught.value.cause == "exposes_ledger"
    assert caught.value.fields["path"] == str(paths["ledgers"])
    assert _planted(paths) == []


async def test_a_write_bind_inside_the_ledgers_hidden_directory_stays_writable_and_the_journal_still_cannot_be_planted(
    tmp_path: Path,
) -> None:
    await checked_bwrap()
    paths = _ledger_outside_home(tmp_path)
    notes = paths["ledgers"] / "notes"
    notes.mkdir()
    report = await _plant(paths, paths["srv"], notes, sibling=notes)
    assert _planted(paths) == []
    assert report["move_directory"] != "moved" and paths["ledger"].read_text() == CANARY
    assert [report[s] for s in ("-journal", "-wal", "-shm")].count("created") == 0
    assert report["sibling"] == "created" and (notes / "allowed.txt").read_text() == "planted by the server"
