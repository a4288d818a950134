"""Long-running commands stop cleanly on SIGTERM or Ctrl-C (SIGINT): the checkpoint publisher
exits 0 with what it did, and the handlers they install are gone once they return."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
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
