"""Real servers and clients started through ``confined`` and a real bwrap.

A third-party server starts confined with no hand-written binds; an ordinary HTTPS client
reaches an allowed host through the proxy; network ``none`` leaves only loopback; the
environment inside is exactly the one given; a start that fails says what was missing; a CPU hog
is stopped by its limit and the hit is recognisable; where bwrap cannot run, a required profile
refuses and an optional one says it runs unconfined.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import python_peer
from tests.mcp.sandbox._tls import BODY, https_server
from tests.mcp.sandbox._util import SERVERS, answering_listener, checked_bwrap, processes_with
from truss._errors import SandboxError
from truss.mcp._procs import find_marked_child
from truss.mcp.sandbox import (
    Bwrap,
    EgressEvent,
    Limits,
    Profile,
    SandboxEvent,
    Spawn,
    confined,
    find_bwrap,
    parse_host_rule,
    plan_for,
)
from truss.mcp.sandbox import _confine as confine_module
from truss.mcp.sandbox._cgroup import Cgroups

pytestmark = pytest.mark.anyio

LIMITS = Limits(memory=512 * 1024 * 1024, processes=64, cpu_s=60, file_size=16 * 1024 * 1024)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home", **extra}


async def _run(spawn: Spawn) -> tuple[int, str, str]:
    with anyio.fail_after(60):
        done = await anyio.run_process([spawn.command, *spawn.args], env=spawn.env, cwd=spawn.cwd, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_confined_mcp_server_time_lists_its_tools_with_no_hand_written_binds(tmp_path: Path) -> None:
    await checked_bwrap()
    command = python_peer("mcp-server-time")
    async with confined(
        Profile(limits=LIMITS), command, ["--local-timezone", "UTC"], _env(), str(tmp_path), server="time"
    ) as spawn:
        params = StdioServerParameters(command=spawn.command, args=spawn.args, env=spawn.env, cwd=spawn.cwd)
        with anyio.fail_after(60), (tmp_path / "stderr").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                result = await session.call_tool("get_current_time", {"timezone": "UTC"})
    assert {t.name for t in tools.tools} == {"get_current_time", "convert_time"}
    assert result.is_error is False
    assert spawn.confined and spawn.description["network"] == "none"
    assert {b["why"] for b in spawn.description["binds"]} >= {"venv", "prefix"}
    assert spawn.limit_hits() == []


async def test_an_ordinary_https_client_reaches_an_allowed_host_only_through_the_proxy(tmp_path: Path) -> None:
    await checked_bwrap()
    events: list[SandboxEvent] = []
    async with https_server(tmp_path) as (port, cafile):
        profile = Profile(
            read=(str(cafile),), network="allow", allow_hosts=(parse_host_rule(f"127.0.0.1:{port}"),), limits=LIMITS
        )
        args = [str(SERVERS / "fetch.py"), f"https://127.0.0.1:{port}/hello", str(cafile)]
        async with confined(
            profile, sys.executable, args, _env(), "/", server="fetch", on_event=events.append
        ) as spawn:
            code, out, err = await _run(spawn)
    assert (code, out) == (0, BODY.decode()), err
    [event] = [e for e in events if isinstance(e, EgressEvent)]
    assert (event.host, event.port, event.decision, event.method) == ("127.0.0.1", port, "allowed", "CONNECT")
    assert event.bytes_up > 0 and event.bytes_down > len(BODY)


async def test_with_network_none_only_loopback_exists_and_the_host_is_unreachable(tmp_path: Path) -> None:
    await checked_bwrap()
    async with (
        answering_listener(b"host service\n") as port,
        confined(Profile(), sys.executable, [str(SERVERS / "probe.py"), str(port)], _env(), "/", server="p") as spawn,
    ):
        code, out, err = await _run(spawn)
    assert code == 0, err
    seen: dict[str, Any] = json.loads(out)
    assert seen["interfaces"] == ["lo"]
    assert seen["reach"] == "ConnectionRefusedError"
    assert seen["hostname"] == "truss-sandbox"
    assert seen["processes"] == [1, 2, 3]  # bwrap's init, Truss's supervisor, the probe: no host process


async def test_the_environment_inside_is_exactly_the_one_given_plus_the_proxy_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await checked_bwrap()
    monkeypatch.setenv("TRUSS_TEST_LEAK", "must-not-reach-the-server")
    env = _env(SERVER_TOKEN="t0ken-value")
    profile = Profile(network="allow", allow_hosts=(parse_host_rule("api.github.com:443"),))
    async with confined(profile, "/usr/bin/env", [], env, "/", server="p") as spawn:
        code, out, err = await _run(spawn)
    assert code == 0, err
    seen = dict(line.split("=", 1) for line in out.splitlines())
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
    # bwrap sets PWD to the working directory, as a shell would.
    assert seen == {**env, **dict.fromkeys(names, "http://127.0.0.1:3128"), "PWD": "/"}


async def test_the_servers_variables_reach_it_inside_but_not_trusss_launcher_outside_by_their_names(
    tmp_path: Path,
) -> None:
    # The launcher runs on the host before bwrap: the loader would honour a LD_PRELOAD or a
    # LD_LIBRARY_PATH given to the server there, unconfined (a library the server wrote into a
    # write bind in an earlier run, say).
    await checked_bwrap()
    loader = {"LD_PRELOAD": str(tmp_path / "absent.so"), "LD_LIBRARY_PATH": str(tmp_path), "GCONV_PATH": str(tmp_path)}
    env = _env(**loader)
    async with confined(Profile(), "/usr/bin/env", [], env, "/", server="p") as spawn:
        outside = dict(spawn.env)
        code, out, err = await _run(spawn)
    assert code == 0, err
    assert not set(env) & set(outside)
    seen = dict(line.split("=", 1) for line in out.splitlines())
    assert seen == {**env, "PWD": "/"}


async def test_a_bind_swapped_for_a_symlink_after_the_plan_is_refused_at_the_start_and_shows_nothing(
    tmp_path: Path,
) -> None:
    # Another process that can write the bind's parent (another confined server with a write bind
    # there) replaces the checked directory with a symlink before bwrap mounts it.
    await checked_bwrap()
    shared, secret = tmp_path / "shared", tmp_path / "secret"
    (shared / "data").mkdir(parents=True)
    secret.mkdir()
    (secret / "identity.key").write_text("CANARY-swapped-bind")
    code_text = f"import os; print(sorted(os.listdir({str(shared / 'data')!r})))"
    async with confined(
        Profile(read=(str(shared / "data"),)), sys.executable, ["-c", code_text], _env(), "/", server="swap"
    ) as spawn:
        (shared / "data").rename(shared / "was-data")
        (shared / "data").symlink_to(secret)
        code, out, err = await _run(spawn)
    assert "CANARY" not in out and "identity.key" not in out
    assert code == 126 and str(shared / "data") in err


async def test_a_start_that_fails_inside_the_sandbox_says_what_was_not_visible(tmp_path: Path) -> None:
    await checked_bwrap()
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 1\n")
    env = _env(PYTHONPATH=str(lib))
    code_text = "import helper_mod"
    async with confined(Profile(), sys.executable, ["-c", code_text], env, "/", server="broken") as spawn:
        code, _, err = await _run(spawn)
    assert code == 1 and "helper_mod" in err
    assert spawn.exit_code() == 1
    assert spawn.plan is not None and ("PYTHONPATH", str(lib)) in spawn.plan.not_visible
    assert spawn.diagnose() is not None


async def test_a_cpu_hog_is_stopped_by_its_limit_and_the_hit_is_recognisable() -> None:
    await checked_bwrap()
    profile = Profile(limits=Limits(cpu_s=1))
    async with confined(profile, sys.executable, [str(SERVERS / "spin.py")], _env(), "/", server="spin") as spawn:
        code, _, err = await _run(spawn)
        hits = spawn.limit_hits()
    assert code == 128 + 24, err  # SIGXCPU
    assert [h.limit for h in hits] == ["cpu"]


async def test_leaving_the_context_ends_a_sandbox_whose_client_never_closed_it(tmp_path: Path) -> None:
    await checked_bwrap()
    marker = f"orphan-{tmp_path.name}"
    env = _env(ORPHAN_MARK=marker)
    async with confined(Profile(), sys.executable, [str(SERVERS / "spin.py")], env, "/", server="orphan") as spawn:
        process = await anyio.open_process([spawn.command, *spawn.args], env=spawn.env)
        with anyio.fail_after(30):
            while not processes_with(marker.encode()):  # noqa: ASYNC110 - waiting for the sandbox to start
                await anyio.sleep(0.01)
    with anyio.fail_after(10):
        await process.wait()
    await process.aclose()
    assert processes_with(marker.encode()) == []


async def test_a_required_profile_refuses_to_start_where_bwrap_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bubblewrap 0.4.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRUSS_BWRAP", str(fake))
    with pytest.raises(SandboxError) as caught:
        async with confined(Profile(required=True), sys.executable, [], _env(), "/", server="s"):
            pass
    assert (caught.value.cause, caught.value.server) == ("bwrap_too_old", "s")
    assert caught.value.remedy


async def test_an_optional_profile_says_loudly_that_it_runs_unconfined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUSS_BWRAP", "/bin/false")
    async with confined(Profile(required=False), sys.executable, ["-V"], _env(), "/", server="s") as spawn:
        assert spawn.confined is False
        assert spawn.fallback == "bwrap_unusable"
        assert spawn.description["confined"] is False
        assert (spawn.command, spawn.args) == (sys.executable, ["-V"])


async def test_find_bwrap_names_a_missing_binary_and_the_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRUSS_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(SandboxError) as caught:
        await find_bwrap(server="s")
    assert caught.value.cause == "bwrap_unusable"


async def test_a_processes_limit_that_root_cannot_have_enforced_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # As root the kernel ignores RLIMIT_NPROC; without a pids cgroup the limit would be a no-op.
    def no_cgroups(name: str, limits: Limits) -> tuple[Cgroups, list[str]]:
        return Cgroups(), ["no writable pids cgroup"]

    monkeypatch.setattr(confine_module, "setup_cgroups", no_cgroups)
    monkeypatch.setattr(confine_module.os, "geteuid", lambda: 0)
    bwrap = Bwrap(path="/usr/bin/bwrap", version="0.11.0", source="test")
    with pytest.raises(SandboxError) as caught:
        async with confined(
            Profile(limits=Limits(processes=8)), sys.executable, [], _env(), "/", server="s", bwrap=bwrap
        ):
            pass
    assert caught.value.cause == "limit_unenforceable"


def _runs(pid: int, path: str) -> bool:
    return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(path)


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


async def test_the_process_truss_spawns_keeps_only_its_spawn_marker_and_becomes_bwrap() -> None:
    # Truss finds a stdio server's process group by the marker in its child's environment.
    bwrap = await checked_bwrap()
    env = _env(TRUSS_MCP_SPAWN="marker-for-this-test", SERVER_TOKEN="t0ken-value-9f")
    async with confined(Profile(), sys.executable, [str(SERVERS / "spin.py")], env, "/", server="m") as spawn:
        process = await anyio.open_process([spawn.command, *spawn.args], env=spawn.env)
        try:
            with anyio.fail_after(30):
                while (pid := find_marked_child("marker-for-this-test")) is None or "exit-code" in spawn.status():  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                while not _runs(pid, bwrap.path):  # noqa: ASYNC110 - the launcher is about to exec bwrap
                    await anyio.sleep(0.01)
            environ = _environ(pid)
        finally:
            process.kill()
            await process.aclose()
    assert environ.split(b"\0") == [b"TRUSS_MCP_SPAWN=marker-for-this-test", b""]


async def test_the_plan_made_before_the_start_describes_the_sandbox_the_start_builds(tmp_path: Path) -> None:
    bwrap = await checked_bwrap()
    command = python_peer("mcp-server-time")
    profile = Profile(read=("/tmp",), limits=LIMITS)  # /tmp holds the runtime directory: masked, never recorded
    before = plan_for(profile, command, [], _env(), str(tmp_path), server="time", bwrap=bwrap).description
    async with confined(profile, command, [], _env(), str(tmp_path), server="time") as spawn:
        during = {k: v for k, v in spawn.description.items() if k not in ("cgroups", "rlimits_only")}
    assert during == before
    assert not any(m.startswith("/tmp/truss-sbx") for m in before["masked"])
