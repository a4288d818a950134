"""``confined(...)``: the one entry point a launcher calls to start a stdio server in its sandbox.

::

    async with confined(profile, command, args, env, cwd, server="git", on_event=sink) as spawn:
        params = StdioServerParameters(command=spawn.command, args=spawn.args, env=spawn.env, cwd=spawn.cwd)
        ...                      # start the server with exactly that, talk to it
        spawn.limit_hits()       # after a failure: which kernel limit stopped it, if any

On entry it checks bwrap, resolves what the command needs, plans the mounts (refusing a plan that
would show Truss's home, key or ledger), creates the cgroups where it may, writes the plan into a
private runtime directory (mode 0700) and, for network ``allow``, waits on a Unix socket there
for the egress listener the sandbox's supervisor hands over, and serves the egress proxy on it.
The command it hands back runs ``_launch.py``, which joins the cgroups and becomes bwrap. On
exit, by any path, it kills whatever is left of the sandbox (its bwrap, and so its pid
namespace; every process of its cgroups), stops the proxy, reports the flood summaries, removes
the cgroups and the runtime directory.

When bwrap cannot run here: a ``required`` profile raises ``SandboxError``; otherwise the spawn
is the plain command with ``confined = False`` and ``fallback`` naming the cause, for the caller
to record and show. It never falls back silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from truss._clock import Clock, SystemClock
from truss._errors import SandboxError
from truss._sandbox_profile import Profile
from truss.mcp._procs import MARKER_ENV
from truss.mcp.sandbox._argv import SandboxPlan, plan_sandbox
from truss.mcp.sandbox._bwrap import Bwrap, find_bwrap
from truss.mcp.sandbox._cgroup import Cgroups, LimitHit, setup_cgroups
from truss.mcp.sandbox._fs import OsFs
from truss.mcp.sandbox._proxy import EgressProxy, EventSink
from truss.mcp.sandbox._resolve import FsView, resolve_command, system_layout

__all__ = ["Spawn", "confined", "plan_for"]

_HERE = Path(__file__).resolve().parent
_LAUNCH = _HERE / "_launch.py"
_INNER = _HERE / "_inner.py"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
_STATUS_LIMIT = 64 * 1024
_EXIT_SIGNALS = {24: "cpu", 25: "file_size"}  # SIGXCPU, SIGXFSZ: the rlimit's own signals
_MAX_HANDOVER_TRIES = 4
_NO_STATUS: dict[str, int] = {}  # shared, never changed: what ``_current_status`` answers before bwrap wrote
_HANDOVER_TIMEOUT_S = 10.0
# The launcher runs on the host, before bwrap: it gets the server's variables only under this
# prefix, so that the loader and libc never honour one of them there (LD_PRELOAD, LD_LIBRARY_PATH,
# GCONV_PATH ...: a library the server wrote into a write bind would run unconfined).
ENV_PREFIX = "TRUSS_SANDBOX_ENV_"


@dataclass
class Spawn:
    """How to start the server (``command``, ``args``, ``env``, ``cwd``) and what became of its sandbox.

    ``confined`` is false only for an optional profile where bwrap cannot run (``fallback`` is
    the cause); ``description`` is the JSON to record; ``plan`` the bwrap plan (binds, masks,
    ``not_visible``). ``runtime_dir`` and ``cgroups`` are the sandbox's while it runs; ``final``
    keeps its status and limit hits once it is torn down.
    """

    command: str
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    confined: bool
    description: dict[str, Any]
    fallback: str | None = None
    plan: SandboxPlan | None = None
    runtime_dir: Path | None = None
    cgroups: Cgroups = field(default_factory=Cgroups)
    # Kept when the sandbox is torn down, so that status and limit hits stay readable afterwards.
    final: tuple[dict[str, int], list[LimitHit]] | None = None
    # The last status read, by the file's (size, mtime): ``status`` is asked after every call.
    _status: tuple[tuple[int, int], dict[str, int]] | None = field(default=None, repr=False, compare=False)
    # The status file, opened once it exists and then only ``fstat``ed (no path walk per call).
    _status_fd: int | None = field(default=None, repr=False, compare=False)

    def status(self) -> dict[str, int]:
        """What bwrap reported so far: ``child-pid`` (the sandbox's init), then ``exit-code``."""
        if self.final is not None:
            return dict(self.final[0])
        return dict(self._current_status())

    def _current_status(self) -> dict[str, int]:
        """``status`` without the copy (callers must not change it); read again only when the file changed."""
        if self.runtime_dir is None:
            return _NO_STATUS
        try:
            fd = self._status_fd
            if fd is None:
                # Created by the launcher (O_TRUNC, before bwrap runs), then only appended to by
                # bwrap: the descriptor opened once sees every later line. The runtime directory
                # is Truss's (mode 0700) and not visible inside the sandbox.
                path = os.path.join(self.runtime_dir, "status.json")
                fd = self._status_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            # Asked after every call (is this a limit's signal?): an unchanged size and time mean
            # an unchanged answer, without a read and parse.
            seen = os.fstat(fd)
            stamp = (seen.st_size, seen.st_mtime_ns)
            if self._status is not None and self._status[0] == stamp:
                return self._status[1]
            text = os.pread(fd, _STATUS_LIMIT, 0)
        except OSError:
            return _NO_STATUS
        out: dict[str, int] = {}
        for line in text.decode("utf-8", "replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    for key, value in record.items():  # pyright: ignore[reportUnknownVariableType]
                        if key in ("child-pid", "exit-code") and isinstance(value, int):
                            out[key] = value
        self._status = (stamp, out)
        return out

    def close(self) -> None:
        """Close the status file (``confined`` does, on exit; ``final`` holds the last status by then)."""
        fd, self._status_fd = self._status_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def exit_code(self) -> int | None:
        """The supervisor's exit status once the sandbox ended (``128 + n``: the server got signal n)."""
        if self.final is not None:
            return self.final[0].get("exit-code")
        return self._current_status().get("exit-code")

    def limit_hits(self) -> list[LimitHit]:
        """The kernel limits the sandbox ran into so far (cgroup counters, a limit's own signal)."""
        hits = list(self.final[1]) if self.final is not None else self.cgroups.hits()
        code = self.exit_code()
        if code is not None and code > 128 and (code - 128) in _EXIT_SIGNALS:
            hits.append(LimitHit(_EXIT_SIGNALS[code - 128], f"the server was ended by signal {code - 128}"))
        return hits

    def diagnose(self) -> str | None:
        """Why a confined start may have failed: the exit status, limits hit, paths not visible inside."""
        if not self.confined or self.plan is None:
            return None
        notes: list[str] = []
        status = self.status()
        code = status.get("exit-code")
        if "child-pid" not in status:
            notes.append("bwrap did not start the sandbox (see the server's stderr for the bwrap: line)")
        elif code == 126:
            notes.append("the sandbox could not be set up (see the server's stderr for the truss-sandbox line)")
        elif code == 127:
            notes.append("the server's executable could not be started inside the sandbox (see its stderr)")
        elif code is not None and code > 128:
            notes.append(f"the server was ended by signal {code - 128}")
        elif code is not None:
            notes.append(f"the server exited with status {code}")
        notes += [f"limit {h.limit} reached ({h.evidence})" for h in self.limit_hits()]
        if self.plan.not_visible:
            listed = ", ".join(f"{path} ({where})" for where, path in self.plan.not_visible)
            notes.append(f"not visible inside the sandbox: {listed}; add what the server needs to the sandbox's read")
        return "; ".join(notes) or None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _helper_python() -> str:
    # The base interpreter, not a venv's: with -I -S the supervisor needs only the standard library.
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def plan_for(
    profile: Profile,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    server: str,
    bwrap: Bwrap,
    protected: Sequence[str | os.PathLike[str]] = (),
    fs: FsView | None = None,
    runtime: Path | None = None,
) -> SandboxPlan:
    """The plan ``confined`` would use, without starting or creating anything. Raises ``SandboxError``.

    Its ``description`` is what ``Spawn.description`` holds, less the cgroup fields that only
    setting up the sandbox decides: a launcher can record it before the start.
    """
    view = fs or OsFs()
    python = _helper_python()
    resolution = resolve_command(view, command, args, env, cwd, server=server)
    helper = resolve_command(view, python, [], {}, "/", server=server)
    system = system_layout(view, network=profile.network != "none")
    guarded = [str(p) for p in protected]
    if os.environ.get("TRUSS_HOME"):
        guarded.append(os.environ["TRUSS_HOME"])
    # Absolute, as Truss itself reads them: a relative home (.truss) is masked as surely as /x/.truss.
    guarded = [os.path.abspath(p) for p in guarded]
    place = runtime or Path(tempfile.gettempdir()) / "truss-sbx-plan"
    return plan_sandbox(
        profile,
        resolution,
        helper,
        system,
        view,
        command=command,
        args=args,
        env=env,
        cwd=cwd,
        protected=guarded,
        runtime_dir=str(place),
        inner_script=str(_INNER),
        proxy_socket=str(place / "proxy.sock") if profile.network == "allow" else None,
        bwrap_version=bwrap.version,
        userns=bwrap.userns,
        server=server,
    )


@asynccontextmanager
async def confined(
    profile: Profile,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None = None,
    *,
    server: str,
    on_event: EventSink | None = None,
    protected: Sequence[str | os.PathLike[str]] = (),
    clock: Clock | None = None,
    bwrap: Bwrap | None = None,
    runtime_parent: str | os.PathLike[str] | None = None,
    fs: FsView | None = None,
    max_egress_events: int | None = None,
) -> AsyncGenerator[Spawn]:
    """Start-up plan for one confined stdio server; see the module docstring. Raises ``SandboxError``.

    ``env`` is exactly the environment the server gets inside (plus the proxy variables with
    network ``allow``); ``Spawn.env`` holds it for the launcher outside, each name prefixed with
    ``ENV_PREFIX`` (Truss's spawn marker excepted); ``protected`` are paths never shown inside
    (Truss's home, the identity key, the ledger database and its ``-wal``/``-shm``/``-journal`` files);
    ``on_event`` receives each
    ``EgressEvent`` and, at the end, the ``EgressSummary`` values (sync or async callable).
    """
    clock = clock or SystemClock()
    view = fs or OsFs()
    workdir = cwd or os.getcwd()
    if bwrap is None:
        try:
            bwrap = await find_bwrap(server=server)
        except SandboxError as exc:
            if profile.required:
                raise
            yield Spawn(
                command=command,
                args=list(args),
                env=dict(env),
                cwd=cwd,
                confined=False,
                fallback=str(exc.cause),
                description={"v": 1, "confined": False, "fallback": exc.cause, "profile": profile.as_json()},
            )
            return
    try:
        runtime = Path(tempfile.mkdtemp(prefix="truss-sbx-", dir=runtime_parent))
    except OSError as exc:
        raise SandboxError(
            f"cannot confine MCP server {server!r}: cannot create its runtime directory: {exc.strerror}",
            server=server,
            cause="runtime_dir",
        ) from None
    socket_path = runtime / "proxy.sock"
    cgroups = Cgroups()
    spawn: Spawn | None = None
    try:
        if len(str(socket_path).encode()) > _MAX_SOCKET_PATH:
            raise SandboxError(
                f"cannot confine MCP server {server!r}: the runtime directory {runtime} is too deep for a Unix socket",
                remedy="Point TMPDIR at a short path such as /tmp",
                server=server,
                cause="runtime_dir",
            )
        plan = plan_for(
            profile,
            command,
            args,
            env,
            workdir,
            server=server,
            bwrap=bwrap,
            protected=protected,
            fs=view,
            runtime=runtime,
        )
        cgroups, reasons = setup_cgroups(runtime.name, profile.limits)
        if profile.limits.processes is not None and "pids" not in cgroups.dirs and os.geteuid() == 0:
            # The kernel never applies RLIMIT_NPROC to root's processes: only a pids cgroup can.
            raise SandboxError(
                f"cannot confine MCP server {server!r}: its processes limit cannot be enforced, "
                "because Truss runs as root and no pids cgroup is writable here",
                remedy="Run Truss as an ordinary user, give it a writable pids cgroup, or remove the processes limit",
                server=server,
                cause="limit_unenforceable",
            )
        description = dict(plan.description)
        description["cgroups"] = cgroups.summary
        description["rlimits_only"] = reasons
        launch = {
            "bwrap": bwrap.path,
            "options": list(plan.options),
            "env_names": list(plan.env_names),
            "env_prefix": ENV_PREFIX,
            # Mounted through a descriptor the launcher opens and checks (no symlink swapped in since).
            "pinned": [b.path for b in plan.binds if b.mode in ("ro", "rw")],
            "extra_env": [list(pair) for pair in plan.extra_env],
            "command": list(plan.command),
            "cgroup_procs": cgroups.procs_files,
            "pid_file": str(runtime / "launcher.pid"),
            "status_file": str(runtime / "status.json"),
            "outer_env": [MARKER_ENV],
        }
        plan_file = runtime / "plan.json"
        fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(launch, handle)
        outside = {MARKER_ENV: env[MARKER_ENV]} if MARKER_ENV in env else {}
        outside.update((ENV_PREFIX + name, value) for name, value in env.items())
        spawn = Spawn(
            command=_helper_python(),
            args=["-I", "-S", str(_LAUNCH), str(plan_file)],
            env=outside,
            cwd=cwd,
            confined=True,
            description=description,
            plan=plan,
            runtime_dir=runtime,
            cgroups=cgroups,
        )
        async with anyio.create_task_group() as tg:
            proxy: EgressProxy | None = None
            if profile.network == "allow":
                proxy = EgressProxy(
                    server,
                    profile.allow_hosts,
                    clock,
                    on_event,
                    **({"max_events": max_egress_events} if max_egress_events is not None else {}),
                )
                control = await anyio.create_unix_listener(socket_path)
                tg.start_soon(_serve_handed_over, proxy, control, socket_path)
            try:
                yield spawn
            finally:
                await _end(spawn, cgroups)
                spawn.final = (spawn.status(), cgroups.hits())
                tg.cancel_scope.cancel()
                if proxy is not None:
                    await proxy.flush()
    finally:
        if spawn is not None:
            spawn.close()
        with anyio.CancelScope(shield=True):
            await cgroups.kill_all()
            cgroups.remove()
            shutil.rmtree(runtime, ignore_errors=True)


async def _serve_handed_over(proxy: EgressProxy, control: anyio.abc.SocketListener, path: Path) -> None:
    """Receive the supervisor's listening socket on the control socket, close that, serve the socket.

    The supervisor hands it over before the server starts; anything else arriving first (it
    cannot, but a sandbox is not trusted) is closed and waited past, a few times at most.
    """
    listener: socket.socket | None = None
    try:
        async with control:
            for _ in range(_MAX_HANDOVER_TRIES):
                connection = await control.accept()
                async with connection:
                    if not isinstance(connection, anyio.abc.UNIXSocketStream):
                        continue
                    try:
                        with anyio.fail_after(_HANDOVER_TIMEOUT_S):
                            _, fds = await connection.receive_fds(64, 1)
                    except (TimeoutError, OSError, anyio.EndOfStream, anyio.BrokenResourceError, RuntimeError):
                        continue
                    listener = _checked_listener(fds[0]) if fds else None
                if listener is not None:
                    break
        with contextlib.suppress(OSError):
            os.unlink(path)  # nothing inside can reach Truss through this path any more
        if listener is not None:
            served = await anyio.abc.SocketListener.from_socket(listener)
            listener = None  # the proxy's listener owns the socket now, and closes it
            await proxy.serve(served)
    finally:
        if listener is not None:
            listener.close()


def _checked_listener(fd: int) -> socket.socket | None:
    """The handed-over socket, when it is a listening TCP socket on 127.0.0.1 (of the sandbox)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        good = sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM and listening
        if good and sock.getsockname()[0] == "127.0.0.1":
            return sock
    except OSError:
        pass
    sock.close()
    return None


async def _end(spawn: Spawn, cgroups: Cgroups) -> None:
    """Kill the sandbox's bwrap (its pid namespace dies with it) and wait until nothing is left."""
    with anyio.CancelScope(shield=True):
        runtime = spawn.runtime_dir
        outer: int | None = None
        if runtime is not None:
            with contextlib.suppress(OSError, ValueError):
                outer = int((runtime / "launcher.pid").read_text().strip())
        init = spawn.status().get("child-pid")
        # Only our own child: a pid the SDK already reaped could belong to someone else by now.
        if outer is not None and _parent_of(outer) == os.getpid() and _alive(outer):
            with contextlib.suppress(OSError):
                os.kill(outer, signal.SIGKILL)
        if init is not None and outer is not None and _parent_of(init) == outer:
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
        await cgroups.kill_all()
        with anyio.move_on_after(5.0):
            # The kernel tears a pid namespace down asynchronously; nothing signals its end.
            while init is not None and _alive(init) and _parent_of(init) in (outer, 1):  # noqa: ASYNC110
                await anyio.sleep(0.01)
