"""A stdio server's stderr: into its log file, capped, and onto the terminal only when asked.

The child writes into a pipe; a daemon thread copies what arrives into
``<log_dir>/<server>.stderr.log`` up to ``STDERR_LOG_CAP_BYTES`` (a server that floods stderr
fills neither the disk nor the terminal; past the cap the rest is read and discarded, so the
child never blocks on a full pipe), and with ``echo`` also to Truss's stderr, each line
prefixed with the server's name. The thread ends when the last writer (the server and anything
it started) is gone.

It does not interpret what the server writes; nothing from it reaches the ledger. It does scrub
secret values from the log and the echo, including a value split across reads: the contract's
``secret_env`` and header secrets (which the server holds and may print, say in a debug dump of its
environment), and each ``secret_args`` value as soon as a call carries it (``remember``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

__all__ = ["STDERR_LOG_CAP_BYTES", "StderrSink"]

STDERR_LOG_CAP_BYTES = 16 * 1024 * 1024
_CHUNK = 65536
_REDACTED = b"[redacted]"
_MIN_SECRET_LEN = 4  # the gate's scrubber ignores shorter values too: they would mangle ordinary text


class StderrSink:
    """One server's stderr pipe and the thread that drains it."""

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        echo: TextIO | None = None,
        cap_bytes: int | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.path = path
        self._secrets: list[bytes] = []
        self._hold = 0
        self._lock = threading.Lock()
        self.remember(secrets)
        self._name = name
        self._echo = echo
        self._cap = STDERR_LOG_CAP_BYTES if cap_bytes is None else cap_bytes
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        # The child gets a duplicate of this descriptor at spawn; ours is closed right after.
        self.writer: TextIO | None = os.fdopen(write_fd, "w")
        self._thread = threading.Thread(target=self._drain, name=f"truss-stderr-{name}", daemon=True)
        self._thread.start()

    def remember(self, secrets: Iterable[str]) -> None:
        """Scrub these values too, from what the server writes from now on (thread-safe)."""
        fresh = {v.encode("utf-8", "surrogatepass") for v in secrets if len(v) >= _MIN_SECRET_LEN}
        with self._lock:
            if fresh <= set(self._secrets):
                return
            # Longest first, so a secret containing another is replaced whole.
            self._secrets = sorted(fresh | set(self._secrets), key=len, reverse=True)
            # Bytes held back between reads: enough that a secret split across two reads is still seen whole.
            self._hold = max(len(v) for v in self._secrets) - 1

    def spawned(self) -> None:
        """Close Truss's copy of the write end, so the log ends when the server's side does."""
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop writing and wait (bounded) for the thread to flush what the server wrote."""
        self.spawned()
        self._thread.join(timeout_s)

    def _drain(self) -> None:
        written = 0
        capped = False
        carry = b""
        try:
            with self.path.open("ab") as log:
                while True:
                    try:
                        data = os.read(self._read_fd, _CHUNK)
                    except OSError:
                        data = b""
                    chunk, carry = self._scrub(carry + data, final=not data)
                    if not chunk and not data:
                        return
                    if written < self._cap:
                        part = chunk[: self._cap - written]
                        log.write(part)
                        written += len(part)
                        log.flush()
                    if written >= self._cap and not capped:
                        capped = True
                        note = f"\n[truss: stderr log capped at {self._cap} bytes; the rest is discarded]\n"
                        log.write(note.encode())
                        log.flush()
                    if self._echo is not None:
                        self._write_echo(chunk)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _scrub(self, data: bytes, *, final: bool) -> tuple[bytes, bytes]:
        """``data`` with the known secrets replaced, split into (safe to write now, held back)."""
        with self._lock:
            secrets, hold = self._secrets, self._hold
        if not secrets:
            return data, b""
        for secret in secrets:
            data = data.replace(secret, _REDACTED)
        if final or hold == 0:
            return data, b""
        cut = max(0, len(data) - hold)
        return data[:cut], data[cut:]

    def _write_echo(self, chunk: bytes) -> None:
        echo = self._echo
        if echo is None:
            return
        text = chunk.decode("utf-8", errors="replace")
        # No terminal escapes from a server, even under --verbose.
        lines = ["".join(c if c.isprintable() or c == "\t" else "?" for c in line) for line in text.splitlines()]
        with contextlib.suppress(OSError, ValueError):
            echo.write("".join(f"[{self._name}] {line}\n" for line in lines))
            echo.flush()
