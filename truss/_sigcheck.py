"""V10 on the second core: a long verified read's Ed25519 checks computed ahead in a helper process.

``process_checks(entries)`` is the ``SignatureSource`` the ``Runtime`` hands its ``VerifiedStore``
(``truss.ledger.reader``): for a session whose row lists at least ``LONG_SESSION`` entries, on a
machine with two cores or more, it starts ``truss/_sigchild.py`` (``python -I``, no shell, an
empty environment, stderr discarded) and returns a ``ProcessSignatureChecks`` over its pipes;
otherwise None (the read checks every signature itself, as before). The row is untrusted, but it
only chooses where the arithmetic runs.

The reader submits each page of entries as it reads it, a page ahead of the one it checks; the
helper checks the signatures of the head of each page (its share, which follows how the previous
page went) while the reader checks the rest itself and runs the other steps; what the reader had
to check itself for want of an answer, the helper is told to skip. The reader's V10 takes a
helper's ``True`` for the entry it checks, and checks the signature itself when there is no answer
yet (it never waits), when the answer is ``False`` (a refusal is always found in process) or when
the helper is gone. The
helper is Truss's own code on a private pipe, so its answers are trusted; it gets public keys and
signed bytes only. Each answer byte carries its frame's number (modulo 128) beside the result, so
an answer is never taken for another entry's. Any error, end of file or unexpected byte means "no
answer" for all that is pending, never a pass and never a crash; the helper is killed and reaped on
``close`` (the end of the read, however it ends). Nothing here blocks: frames that do not fit in
the pipe wait in a buffer for the next ``answer``; reads take what has arrived.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from truss._clock import SystemClock
from truss.ledger.entry import StoredEntry, entry_signing_payload

if TYPE_CHECKING:
    import subprocess

    from truss.ledger.keys import TrustedKeys

# Every Runtime hands ``process_checks`` to its reader, so importing this module is part of every
# command's start-up: ``subprocess``, ``select`` and ``weakref`` (~5 ms) are imported only when a
# long session's read starts a helper.

__all__ = ["LONG_SESSION", "ProcessSignatureChecks", "process_checks"]

LONG_SESSION = 2048
"""Entries from which a read's signature checks go to a helper (its start-up, ~20-40 ms of the
other core and ~2 ms of this one, is small next to ~45 us a check)."""

_CHILD = Path(__file__).with_name("_sigchild.py")
_PIPE_BYTES = 1 << 20  # asked of the kernel for the frames' pipe (bounded by fs.pipe-max-size)
_MAX_KEYS = 255
_FIRST_SHARE = 0.5  # of the first page (the helper starts meanwhile); then between these:
_MIN_SHARE = 0.1
_MAX_SHARE = 1.0
_PROBE = 0.1  # more for the helper after a page it answered all of in time
_BEHIND = 8  # entries checked in process before the pipe is read again, when the helper was behind


def process_checks(entries: int) -> ProcessSignatureChecks | None:
    """Checks in a helper process for a read of a session listing ``entries`` entries, or None
    (a short session, one core, no way to start the helper)."""
    if entries < LONG_SESSION or os.name != "posix" or _cores() < 2 or not sys.executable:
        return None
    return ProcessSignatureChecks.start()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _reap(process: subprocess.Popen[bytes], skip: int) -> None:
    import subprocess

    with contextlib.suppress(OSError):
        os.close(skip)
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        process.wait(timeout=5)


class ProcessSignatureChecks:
    """``SignatureChecks`` (``truss.ledger.verification``) answered by a helper process."""

    def __init__(self, process: subprocess.Popen[bytes], skip: int) -> None:
        import weakref

        assert process.stdin is not None and process.stdout is not None
        self._process: subprocess.Popen[bytes] | None = process
        self._to = process.stdin.fileno()
        self._from = process.stdout.fileno()
        self._skip = skip
        os.set_blocking(self._to, False)
        os.set_blocking(self._from, False)
        os.set_blocking(skip, False)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            import fcntl

            fcntl.fcntl(self._to, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        self._reaper = weakref.finalize(self, _reap, process, skip)
        self._slots: dict[int, tuple[StoredEntry, int]] = {}  # id(entry) -> (entry, frame number)
        self._older: dict[int, tuple[StoredEntry, int]] = {}
        self._frames = 0
        self._unsent = bytearray()
        self._answers = bytearray()  # the helper's answers, by frame number
        self._next_pump = 0
        # The helper checks the first ``_share`` of each page while the reader checks the rest itself;
        # given a page ahead, the helper's part is ready when the reader gets to it. The share
        # follows the last page: smaller by what was not ready in time, larger when all was.
        self._share = _FIRST_SHARE
        self._late = 0
        self._page = 0
        self.answered = 0  # entries answered ``True`` from the helper (what the tests and benches read)

    @classmethod
    def start(cls) -> ProcessSignatureChecks | None:
        import subprocess

        environ = {name: os.environ[name] for name in ("LD_LIBRARY_PATH",) if name in os.environ}
        try:
            skips, skip = os.pipe()  # the frames the reader has checked itself: the helper skips them
        except OSError:
            return None
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", str(_CHILD), str(skips)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                stderr=subprocess.DEVNULL,
                env=environ,
                close_fds=True,
                pass_fds=(skips,),
            )
        except (OSError, ValueError, subprocess.SubprocessError):
            os.close(skip)
            return None
        finally:
            os.close(skips)
        try:
            return cls(process, skip)
        except (OSError, ValueError):
            _reap(process, skip)
            return None

    @property
    def pid(self) -> int | None:
        """The helper's process id while it runs here (None once it is gone)."""
        return None if self._process is None else self._process.pid

    def submit(self, items: Sequence[StoredEntry], trusted: TrustedKeys) -> None:
        if self._process is None:
            return
        # Two pages are asked about: this one and the one being checked (the reader reads a page
        # ahead); the one before has been checked.
        self._older, self._slots = self._slots, {}
        self._adjust(len(items))
        frames = self._unsent
        for item in items[: round(len(items) * self._share)]:
            sig = item.sig
            keys = trusted.get(item.keyid) if type(item.keyid) is str else []
            if type(sig) is not bytes or len(sig) != 64 or not keys or len(keys) > _MAX_KEYS:
                continue  # checked in process (and refused there when it must be)
            message = entry_signing_payload(item.raw)
            frames += len(keys).to_bytes(1, "big") + len(message).to_bytes(4, "big")
            for key in keys:
                frames += key.public_key
            frames += sig
            frames += message
            self._slots[id(item)] = (item, self._frames)
            self._frames += 1
        self._pump()

    def answer(self, item: StoredEntry) -> bool | None:
        slot = self._slots.get(id(item)) or self._older.get(id(item))
        if slot is None or slot[0] is not item:
            return None
        number = slot[1]
        if number >= len(self._answers):
            self._late += 1
            if self._process is None or number < self._next_pump:
                return None
            self._pump()
            if number >= len(self._answers):
                # The helper is behind: the reader checks the next few itself, and the helper skips them.
                self._next_pump = number + _BEHIND
                with contextlib.suppress(OSError):
                    os.write(self._skip, self._next_pump.to_bytes(8, "big"))
                return None
            self._late -= 1
        byte = self._answers[number]
        if byte >> 1 != number & 0x7F:  # not the answer to this frame: the helper is not followed again
            self._gone()
            return None
        verified = byte & 1 == 1
        if verified:
            self.answered += 1
        return verified

    def settle(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until the helper has answered every frame submitted:
        whether it has (False: it is gone, or slower). The reader never calls this; tests and
        benches do, to know that the answers came from the helper."""
        import select

        clock = SystemClock()
        deadline = clock.monotonic() + timeout
        while self._process is not None and len(self._answers) < self._frames:
            left = deadline - clock.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(OSError, ValueError):
                select.select([self._from], [self._to] if self._unsent else [], [], left)
            self._pump()
        return len(self._answers) >= self._frames

    def _adjust(self, size: int) -> None:
        """The helper's share of the next page of ``size`` entries, from how the last page went."""
        last, late = self._page, self._late
        self._page, self._late = size, 0
        if last and self._answers:  # a page went by with the helper up
            if late:
                # Half what was late: the page after it was already handed over at the same share,
                # and is counted next time.
                self._share = max(_MIN_SHARE, self._share - late / last / 2)
            else:
                self._share = min(_MAX_SHARE, self._share + _PROBE)

    def _pump(self) -> None:
        """Write what fits of the frames not yet sent; read the answers that have arrived."""
        try:
            if self._unsent:
                with contextlib.suppress(BlockingIOError):
                    sent = os.write(self._to, self._unsent)
                    del self._unsent[:sent]
            while True:
                try:
                    data = os.read(self._from, 65536)
                except BlockingIOError:
                    return
                if not data or len(self._answers) + len(data) > self._frames:
                    self._gone()  # ended, or said more or other than it was asked: no more answers
                    return
                self._answers += data
        except OSError:
            self._gone()

    def _gone(self) -> None:
        self._slots, self._older = {}, {}
        self._unsent.clear()
        self.close()

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            self._reaper.detach()
            _reap(process, self._skip)
