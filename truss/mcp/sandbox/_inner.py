"""Truss's supervisor inside a sandbox: the egress listener, limits, then the server. Standard library only.

Run by bwrap as ``python -I -S /run/truss/inner.py CONFIG -- EXECUTABLE ARGV0 ARGS...`` (the
interpreter Truss itself runs on, bound read-only). It

1. with network ``allow``, makes the relay's loopback TCP listener (``127.0.0.1:3128``, before
   the server starts, so its first request finds it) and hands the listening socket to the
   egress proxy over its Unix socket (``SCM_RIGHTS``): Truss accepts the server's connections on
   it directly, so ``HTTP_PROXY``/``HTTPS_PROXY`` work for ordinary clients and no process inside
   forwards bytes;
2. forks the server: restores the signal dispositions Python changed (an ignored ``SIGPIPE`` or
   ``SIGXFSZ`` would be inherited across ``exec``), applies the rlimits (in the new user
   namespace, so ``RLIMIT_NPROC`` counts only the sandbox's tasks), and execs it; when the exec
   fails it says on stderr which path is missing inside the sandbox;
3. waits for the server, forwards SIGTERM/SIGINT/SIGHUP to it, and exits with its status
   (``128 + signal`` when a signal ended it), which bwrap reports to Truss. When it exits, bwrap
   ends the sandbox's pid namespace, and with it every process the server left behind.

It never reads the server's data and holds no secret: the environment is the server's own.

Its start is part of every confined server's: it imports only modules that load in a few
milliseconds (``json``, ``contextlib``, ``signal`` and ``socket`` would pull in ``re``, ``enum``
and ``collections``, several times what the interpreter itself costs to start); the config is
read with the JSON module's C scanner, ``socket`` and ``struct`` only where they are needed.
"""

from __future__ import annotations

import _json  # pyright: ignore[reportMissingModuleSource] - the C half of json, without re
import errno
import os
import resource
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from typing import Any
else:
    import _signal  # the C module itself: signal builds enums of its constants

_RLIMITS = {
    "CORE": resource.RLIMIT_CORE,
    "DATA": resource.RLIMIT_DATA,
    "NPROC": resource.RLIMIT_NPROC,
    "CPU": resource.RLIMIT_CPU,
    "FSIZE": resource.RLIMIT_FSIZE,
}
_LIMIT_SIGNALS: dict[int, str] = {int(_signal.SIGXCPU): "cpu", int(_signal.SIGXFSZ): "file_size"}


def _say(text: str) -> None:
    try:  # noqa: SIM105 - contextlib would cost an import
        os.write(2, f"truss-sandbox: {text}\n".encode(errors="replace"))
    except OSError:
        pass


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
    """``json.loads`` for a document Truss wrote, without importing ``json`` (and with it ``re``).

    The same few lines are in ``_launch.py``, which cannot import this file (``python -I``).
    """
    value, end = _json.make_scanner(_JsonContext)(text, 0)  # pyright: ignore[reportArgumentType]
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[2] != "--":
        _say("usage: inner.py CONFIG -- EXECUTABLE ARGV0 [ARGS...]")
        return 2
    config = load_json(argv[1])
    executable, argv0, args = argv[3], argv[4], argv[5:]
    relay = config.get("relay")
    if relay:
        try:
            _hand_over_listener(int(relay["port"]), str(relay["socket"]))
        except OSError as exc:
            _say(f"cannot set up the egress relay: {exc}: the server was not started")
            return 126
    server = os.fork()
    if server == 0:
        _exec_server(executable, argv0, args, config.get("rlimits") or {})
    _detach_stdio()  # the server alone holds the pipes, so Truss sees EOF when it closes them
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, lambda s, _f: _forward(server, s))
    status = _wait(server)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        limit = _LIMIT_SIGNALS.get(sig)
        if limit is not None:
            _say(f"the server was stopped by signal {sig}: it reached its {limit} limit")
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _forward(pid: int, sig: int) -> None:
    try:  # noqa: SIM105 - contextlib would cost an import
        os.kill(pid, sig)
    except OSError:
        pass


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _exec_server(executable: str, argv0: str, args: list[str], rlimits: dict[str, int]) -> None:
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGXCPU, _signal.SIGINT):
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        for name, value in rlimits.items():
            # CPU: SIGXCPU at the limit (recognisable), SIGKILL a second later if it is ignored;
            # with both equal the kernel sends SIGKILL first.
            hard = int(value) + 1 if name == "CPU" else int(value)
            resource.setrlimit(_RLIMITS[name], (int(value), hard))
    except (OSError, ValueError, KeyError) as exc:
        _say(f"cannot apply the limit {exc}: the server was not started")
        os._exit(126)
    try:
        # The environment exactly as bwrap set it: /proc/self/environ is the block this process
        # was started with, before Python's locale coercion added LC_CTYPE to os.environ.
        os.execve(executable, [argv0, *args], _initial_environ())  # noqa: S606 - the server's own command
    except OSError as exc:
        _say(f"cannot start {executable}: {exc.strerror}. {_explain(executable, exc)}")
    os._exit(127)


def _initial_environ() -> dict[str, str]:
    try:
        with open("/proc/self/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return dict(os.environ)
    env: dict[str, str] = {}
    for item in block.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def _explain(path: str, exc: OSError) -> str:
    """Which path the failed exec needed that the sandbox does not show."""
    if not os.path.lexists(path):
        return f"{path} is not visible inside the sandbox: add its directory to the sandbox's read paths"
    if exc.errno == errno.EACCES:
        return f"{path} is not executable inside the sandbox"
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return f"{path} cannot be read inside the sandbox"
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n", 1)[0].strip().split(b" ", 1)[0].decode(errors="replace")
        if not os.path.exists(interpreter):
            return f"its #! interpreter {interpreter} is not visible inside the sandbox"
    loader = _elf_interpreter(head)
    if loader and not os.path.exists(loader):
        return f"its dynamic loader {loader} is not visible inside the sandbox"
    return "a file it needs is not visible inside the sandbox"


def _elf_interpreter(head: bytes) -> str | None:
    """PT_INTERP of a 64-bit little-endian ELF file (the usual Linux case), from its first bytes."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    import struct  # only when a start failed

    (phoff,) = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 56 > len(head):
            return None
        (kind,) = struct.unpack_from("<I", head, at)
        if kind == 3:  # PT_INTERP
            (offset,) = struct.unpack_from("<Q", head, at + 8)
            (size,) = struct.unpack_from("<Q", head, at + 32)
            if offset + size <= len(head):
                return head[offset : offset + size].rstrip(b"\0").decode(errors="replace")
    return None


def _hand_over_listener(port: int, path: str) -> None:
    """Listen on 127.0.0.1:PORT inside, and give the listening socket to Truss's egress proxy.

    The socket belongs to the sandbox's network namespace; Truss accepts on it from outside, so
    no process inside forwards bytes. It is made and handed over before the server exists, and
    this process keeps no copy: nothing inside can accept on it.
    """
    import socket  # only with network allow: it imports enum and selectors

    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    with listener, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
        control.settimeout(30)
        control.connect(path)
        socket.send_fds(control, [b"listener"], [listener.fileno()])
        control.recv(1)  # Truss closes the connection once it holds the socket


if __name__ == "__main__":
    sys.exit(main(sys.argv))
