"""Stopping a long-running command (a server, a publisher) cleanly on SIGINT or SIGTERM, and SIGTERM
ending a command the way Ctrl-C does before the command watches for it itself.

What it does not do: stop anything itself; the command waits on the event and returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType

__all__ = ["sigterm_interrupts", "stop_on_signals"]


@contextmanager
def stop_on_signals() -> Generator[threading.Event]:
    """An event that SIGINT (Ctrl-C) or SIGTERM sets while the block runs; the handlers there were
    before come back when it ends, however it ends."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # A handler runs on the main thread between two of its bytecodes, which may be inside
        # ``stop.wait()`` while it holds the event's lock: setting the event here would wait for
        # ever on a lock its own thread holds. Another thread sets it once that lock is let go.
        threading.Thread(target=stop.set, name="truss-stop", daemon=True).start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def sigterm_interrupts() -> Generator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` while the block runs, as Ctrl-C does: the command ends
    with "interrupted" and exit 130 instead of dying at once with nothing said (SIGTERM's default).

    For the stretch of a command before it installs its own watcher (``truss resume`` reading and
    verifying the whole session first): a watcher opened inside the block takes SIGTERM over while
    it is open. The handler there was before comes back when the block ends. Off the main thread,
    where no handler can be installed, the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
