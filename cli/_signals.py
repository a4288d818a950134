"""Stopping a long-running command (a server, a publisher) cleanly on SIGINT or SIGTERM.

What it does not do: stop anything itself; the command waits on the event and returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType

__all__ = ["stop_on_signals"]


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
