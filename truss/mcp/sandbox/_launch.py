"""The command a confined server is started with: joins the cgroups, then becomes bwrap. Stdlib only.

Run as ``python -I -S _launch.py PLAN.json`` by whatever starts the stdio server (the MCP SDK),
with the server's environment under prefixed names (``TRUSS_SANDBOX_ENV_PATH``: this process runs
on the host, where the loader must not honour the server's ``LD_PRELOAD`` or ``LD_LIBRARY_PATH``).
It

1. writes its own pid into each of the sandbox's ``cgroup.procs`` (so bwrap and everything it
   starts are limited from the first instruction) and into ``launcher.pid`` (so Truss can end the
   sandbox even if the SDK did not);
2. opens each bind the plan checked (``pinned``: real paths, no symlink in them) and checks
   that it still is that path and no symlink, then has bwrap mount what it opened
   (``--ro-bind-fd``/``--bind-fd``): a directory swapped for a symlink since the plan (by another
   process that can write its parent) refuses the start instead of showing where the link leads;
3. puts bwrap's options, ``--clearenv`` and one ``--setenv`` per variable the plan names (values
   from its own environment) into an anonymous memory file passed as ``--args FD``: secret values
   never appear on a command line, which any local user can read;
4. execs bwrap with an environment holding only Truss's spawn marker (``TRUSS_MCP_SPAWN``, so
   that Truss still finds the process group it started) and ``--json-status-fd`` on a file
   Truss reads (the sandbox's init pid, then its exit code).

Any failure before the exec is reported on stderr and ends with exit status 126; nothing is
started unconfined.

Like the supervisor (``_inner.py``), it imports nothing slow to load: the plan is read with the
supervisor's JSON reader (the JSON module's C scanner), not with ``json``.
"""

from __future__ import annotations

import _json  # pyright: ignore[reportMissingModuleSource] - the C half of json, without re
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _fail(text: str) -> int:
    try:  # noqa: SIM105 - contextlib would cost an import
        os.write(2, f"truss-sandbox: {text}\n".encode(errors="replace"))
    except OSError:
        pass
    return 126


class _JsonContext:
    """What ``_json.make_scanner`` reads from a decoder: plain JSON, nothing custom."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}  # noqa: RUF012 - read by the scanner, never shared

    @staticmethod
    def parse_constant(name: str) -> None:
        raise ValueError(f"not JSON: {name}")


def load_json(text: str) -> Any:
    """``json.loads`` for the plan Truss wrote (as in ``_inner.py``, which ``python -I`` cannot import)."""
    value, end = _json.make_scanner(_JsonContext)(text, 0)  # pyright: ignore[reportArgumentType]
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def pin_binds(options: list[str], pinned: list[str]) -> list[str]:
    """``options`` with each ``--bind P P``/``--ro-bind P P`` of a pinned path made ``--bind-fd FD P``.

    Raises ``OSError`` when a pinned path is gone, is a symlink now, or resolves elsewhere (a
    component swapped for a symlink). The descriptors are left open and inheritable for bwrap,
    which mounts what they name and closes them before the sandbox runs anything.
    """
    wanted = set(pinned)
    out = list(options)
    for i, word in enumerate(out[:-2]):
        if word not in ("--bind", "--ro-bind") or out[i + 1] != out[i + 2] or out[i + 1] not in wanted:
            continue
        path = out[i + 1]
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        if stat.S_ISLNK(os.fstat(fd).st_mode) or os.readlink(f"/proc/self/fd/{fd}") != path:
            os.close(fd)
            raise OSError(f"{path} changed since the sandbox was planned (it is or goes through a symlink now)")
        os.set_inheritable(fd, True)
        out[i : i + 2] = [f"{word}-fd", str(fd)]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        return _fail("usage: _launch.py PLAN.json")
    try:
        with open(argv[1], encoding="utf-8") as handle:
            plan = load_json(handle.read())
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read the sandbox plan: {exc}")
    me = str(os.getpid())
    for procs in plan["cgroup_procs"]:
        try:
            with open(procs, "w", encoding="ascii") as handle:
                handle.write(me)
        except OSError as exc:
            return _fail(f"cannot join the sandbox's cgroup {procs}: {exc.strerror}")
    try:
        with open(plan["pid_file"], "w", encoding="ascii") as handle:
            handle.write(me)
    except OSError as exc:
        return _fail(f"cannot record the sandbox's pid: {exc.strerror}")
    try:
        options = pin_binds(plan["options"], plan["pinned"])
    except OSError as exc:
        return _fail(f"cannot pin the sandbox's binds: {exc}; nothing was started")
    words: list[str] = [*options, "--clearenv"]
    prefix = plan["env_prefix"]
    for name in plan["env_names"]:
        value = os.environ.get(prefix + name)
        if value is not None:
            words += ["--setenv", name, value]
    for name, value in plan["extra_env"]:
        words += ["--setenv", name, value]
    try:
        args_fd = os.memfd_create("truss-bwrap-args", 0)
        os.write(args_fd, b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words))
        os.lseek(args_fd, 0, os.SEEK_SET)
        status_fd = os.open(plan["status_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.set_inheritable(status_fd, True)
    except OSError as exc:
        return _fail(f"cannot prepare bwrap's arguments: {exc.strerror}")
    bwrap = plan["bwrap"]
    command = [bwrap, "--args", str(args_fd), "--json-status-fd", str(status_fd), *plan["command"]]
    # bwrap's own environment: only Truss's spawn marker (no secret), so that Truss still finds
    # this process, and with it the server's process group, after the exec.
    outer = {name: os.environ[name] for name in plan["outer_env"] if name in os.environ}
    try:
        os.execve(bwrap, command, outer)  # noqa: S606 - bwrap itself, found and checked by truss
    except OSError as exc:
        return _fail(f"cannot run {bwrap}: {exc.strerror}")
    return 126  # not reached: execve returned without raising


if __name__ == "__main__":
    sys.exit(main(sys.argv))
