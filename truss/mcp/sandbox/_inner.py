"""Truss's supervisor inside a sandbox: limits, the egress relay, then the server. Standard library only.

Run by bwrap as ``python -I -S /run/truss/inner.py CONFIG -- EXECUTABLE ARGV0 ARGS...`` (the
interpreter Truss itself runs on, bound read-only). It

1. starts the relay when the network mode is ``allow``: a loopback TCP listener (bound before
   the server starts, so its first request finds it) forwarding every connection to the egress
   proxy's Unix socket, so that ``HTTP_PROXY``/``HTTPS_PROXY`` work for ordinary clients;
2. forks the server: restores the signal dispositions Python changed (an ignored ``SIGPIPE`` or
   ``SIGXFSZ`` would be inherited across ``exec``), applies the rlimits (in the new user
   namespace, so ``RLIMIT_NPROC`` counts only the sandbox's tasks), and execs it; when the exec
   fails it says on stderr which path is missing inside the sandbox;
3. waits for the server, forwards SIGTERM/SIGINT/SIGHUP to it, and exits with its status
   (``128 + signal`` when a signal ended it), which bwrap reports to Truss. When it exits, bwrap
   ends the sandbox's pid namespace, and with it every process the server left behind.

It never reads the server's data and holds no secret: the environment is the server's own.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys

_MAX_RELAYED = 256
_CHUNK = 65536
_PENDING_LIMIT = 1 << 20
_RLIMITS = {
    "CORE": resource.RLIMIT_CORE,
    "DATA": resource.RLIMIT_DATA,
    "NPROC": resource.RLIMIT_NPROC,
    "CPU": resource.RLIMIT_CPU,
    "FSIZE": resource.RLIMIT_FSIZE,
}
_LIMIT_SIGNALS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"truss-sandbox: {text}\n".encode(errors="replace"))


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[2] != "--":
        _say("usage: inner.py CONFIG -- EXECUTABLE ARGV0 [ARGS...]")
        return 2
    config = json.loads(argv[1])
    executable, argv0, args = argv[3], argv[4], argv[5:]
    relay_pid = None
    relay = config.get("relay")
    if relay:
        listener = socket.create_server(("127.0.0.1", int(relay["port"])), backlog=128)
        relay_pid = os.fork()
        if relay_pid == 0:
            _detach_stdio()
            try:
                _relay(listener, str(relay["socket"]))
            finally:
                os._exit(0)
        listener.close()
    server = os.fork()
    if server == 0:
        _exec_server(executable, argv0, args, config.get("rlimits") or {})
    _detach_stdio()  # the server alone holds the pipes, so Truss sees EOF when it closes them
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: _forward(server, s))
    status = _wait(server)
    if relay_pid is not None:
        with contextlib.suppress(OSError):
            os.kill(relay_pid, signal.SIGKILL)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        limit = _LIMIT_SIGNALS.get(signal.Signals(sig)) if sig in signal.Signals.__members__.values() else None
        if limit is not None:
            _say(f"the server was stopped by {signal.Signals(sig).name}: it reached its {limit} limit")
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


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
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
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


class _End:
    """One socket of a relayed pair: ``out`` holds bytes read from the peer, waiting to be sent here."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer: _End = self
        self.out = bytearray()
        self.reading = True
        self.shut_after_flush = False
        self.closed = False
        self.mask = 0


def _relay(listener: socket.socket, path: str) -> None:
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    live = 0
    while True:
        for key, events in sel.select():
            if key.data is None:
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                if live >= _MAX_RELAYED:
                    client.close()
                    continue
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(path)
                except OSError:
                    client.close()
                    upstream.close()
                    continue
                a, b = _End(client), _End(upstream)
                a.peer, b.peer = b, a
                for end in (a, b):
                    end.sock.setblocking(False)
                    _watch(sel, end, selectors.EVENT_READ)
                live += 1
                continue
            end: _End = key.data
            if end.closed:
                continue
            try:
                if events & selectors.EVENT_READ and end.reading:
                    data = end.sock.recv(_CHUNK)
                    if data:
                        end.peer.out += data
                    else:
                        end.reading = False
                        end.peer.shut_after_flush = True
                if events & selectors.EVENT_WRITE and end.out:
                    sent = end.sock.send(end.out)
                    del end.out[:sent]
                if end.peer.out and not end.peer.closed:
                    try:
                        sent = end.peer.sock.send(end.peer.out)
                        del end.peer.out[:sent]
                    except BlockingIOError:
                        pass
                for side in (end, end.peer):
                    if side.shut_after_flush and not side.out:
                        side.shut_after_flush = False
                        with contextlib.suppress(OSError):
                            side.sock.shutdown(socket.SHUT_WR)
            except OSError:
                end.reading = end.peer.reading = False
                end.out.clear()
                end.peer.out.clear()
            if not end.reading and not end.peer.reading and not end.out and not end.peer.out:
                for side in (end, end.peer):
                    side.closed = True
                    _watch(sel, side, 0)
                    side.sock.close()
                live -= 1
                continue
            for side in (end, end.peer):
                mask = 0
                if side.reading and len(side.peer.out) < _PENDING_LIMIT:
                    mask |= selectors.EVENT_READ
                if side.out:
                    mask |= selectors.EVENT_WRITE
                _watch(sel, side, mask)


def _watch(sel: selectors.BaseSelector, side: _End, mask: int) -> None:
    """Wait for exactly ``mask`` on ``side`` (none: unregistered, so an EOF'd socket cannot spin)."""
    if mask == side.mask:
        return
    if side.mask and mask:
        sel.modify(side.sock, mask, side)
    elif mask:
        sel.register(side.sock, mask, side)
    else:
        sel.unregister(side.sock)
    side.mask = mask


if __name__ == "__main__":
    sys.exit(main(sys.argv))
