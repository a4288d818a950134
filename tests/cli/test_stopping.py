"""Long-running commands stop cleanly on SIGTERM or Ctrl-C (SIGINT): the checkpoint publisher
exits 0 with what it did, and the handlers they install are gone once they return."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from truss_cli._signals import stop_on_signals

from tests.conftest import REPO, truss_cmd

WAIT_S = 60


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_checkpoint_publisher_stops_on_sigterm_or_ctrl_c_with_exit_0(truss_home: Path, sig: int) -> None:
    env = dict(os.environ, TRUSS_HOME=str(truss_home))
    subprocess.run([*truss_cmd(), "init"], env=env, cwd=REPO, capture_output=True, timeout=WAIT_S, check=True)
    proc = subprocess.Popen(
        [*truss_cmd(), "--json", "ledger", "checkpoint", "--every", "50ms"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        err = proc.stderr
        assert err is not None
        threading.Thread(target=lambda: lines.put(err.readline()), daemon=True).start()
        assert lines.get(timeout=WAIT_S).startswith("publishing checkpoints of ")
        proc.send_signal(sig)
        out, rest = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
    assert proc.returncode == 0 and "Traceback" not in rest
    assert json.loads(out) == {"published": 0}


def test_a_signal_in_the_block_sets_the_event_and_the_previous_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyError), stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(WAIT_S)
        raise KeyError("the block ends by raising")
    assert {sig: signal.getsignal(sig) for sig in before} == before


# The signal lands while the main thread holds the event's own lock, as it does for a moment inside
# ``stop.wait()`` (between taking the lock and waiting on it, and again once woken): the handler runs
# on that very thread. A handler that takes the lock itself waits for ever, and the command with it.
SIGNAL_INSIDE_WAIT = """
import faulthandler, os, signal, sys
from truss_cli._signals import stop_on_signals

faulthandler.dump_traceback_later(20, exit=True)  # a hang ends here instead of in the test's timeout
with stop_on_signals() as stop:
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    print("stopped" if stop.wait(20) else "not stopped")
"""


def test_a_sigterm_while_the_command_is_inside_its_wait_still_stops_it() -> None:
    command = [sys.executable, "-c", SIGNAL_INSIDE_WAIT]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr
