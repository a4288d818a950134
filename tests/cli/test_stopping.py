"""Long-running commands stop cleanly on SIGTERM or Ctrl-C (SIGINT): the checkpoint publisher
exits 0 with what it did, and the handlers they install are gone once they return; a resume
stopped while it still reads the session it continues exits 130 and writes nothing."""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest
from truss_cli._signals import sigterm_interrupts, stop_on_signals

from tests.conftest import REPO, truss_cmd
from tests.durability.support import cli, counting_contract, make_home, truss

WAIT_S = 60


def _signal_once_started(command: list[str], env: dict[str, str], started: str, sig: int) -> tuple[int, str, str]:
    """Start ``command`` with a stdin nothing is written to, wait for its first line on stderr (it
    must start with ``started``), send it ``sig`` and wait for its end: its exit code, its stdout
    and the rest of its stderr. Every wait is bounded; a process still running is killed."""
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        err = proc.stderr
        assert err is not None
        threading.Thread(target=lambda: lines.put(err.readline()), daemon=True).start()
        first = lines.get(timeout=WAIT_S)
        assert first.startswith(started), first
        proc.send_signal(sig)
        out, rest = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
    return proc.returncode, out, rest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_checkpoint_publisher_stops_on_sigterm_or_ctrl_c_with_exit_0(truss_home: Path, sig: int) -> None:
    env = dict(os.environ, TRUSS_HOME=str(truss_home))
    subprocess.run([*truss_cmd(), "init"], env=env, cwd=REPO, capture_output=True, timeout=WAIT_S, check=True)
    command = [*truss_cmd(), "--json", "ledger", "checkpoint", "--every", "50ms"]
    code, out, rest = _signal_once_started(command, env, "publishing checkpoints of ", sig)
    assert code == 0 and "Traceback" not in rest
    assert json.loads(out) == {"published": 0}


def test_a_signal_in_the_block_sets_the_event_and_the_previous_handlers_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyError), stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(WAIT_S)
        raise KeyError("the block ends by raising")
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sigterm_in_a_sigterm_interrupts_block_raises_keyboard_interrupt_and_the_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(WAIT_S)  # the handler raises out of this wait
    assert signal.getsignal(signal.SIGTERM) == before


# The signal lands while the main thread holds the event's own lock, as it does for a moment inside
# ``stop.wait()`` (between taking the lock and waiting on it, and again once woken): the handler runs
# on that very thread. A handler that takes the lock itself waits for ever, and the command with it.
SIGNAL_INSIDE_WAIT = """
import faulthandler, os, signal, sys
from truss_cli._signals import sigterm_interrupts, stop_on_signals

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


# ``truss`` whose store pauses the first read of session s1 after its first entry, until stdin has
# something (never: the test writes nothing) or 60 s pass: the stretch where a long session's
# verified read still goes on, held open so that a signal lands inside it whatever the machine's speed.
PAUSED_READ = """
import select, sys
from truss.ledger.stores.sqlite import SqliteStore
from truss_cli.main import main

read = SqliteStore.read_session
paused = []

def read_session(self, session, *, from_seq=0):
    for entry in read(self, session, from_seq=from_seq):
        yield entry
        if session == "s1" and not paused:
            paused.append(entry.seq)
            sys.stderr.write("reading s1\\n")
            sys.stderr.flush()
            select.select([sys.stdin], [], [], 60)

SqliteStore.read_session = read_session
sys.exit(main(sys.argv[1:]))
"""


def _head(home: Path, session: str) -> tuple[int, str]:
    """How many entries the store holds for ``session`` and the hash of its last, read from the file."""
    with closing(sqlite3.connect(home / "ledger.db")) as conn:
        rows = conn.execute("SELECT seq, hash FROM entries WHERE session = ? ORDER BY seq", (session,)).fetchall()
    return len(rows), str(rows[-1][1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["resume", "run"])
@pytest.mark.parametrize("record", ["killed", "waiting_for_approval"])
def test_a_stop_while_resume_or_run_still_reads_the_session_exits_130_and_records_nothing(
    tmp_path: Path, sig: int, command: str, record: str
) -> None:

    home = make_home(tmp_path / "home")
    steps = [("mcp:cnt:count", {"key": "first"}), ("mcp:cnt:count", {"key": "second"})]
    # A session killed before it was sealed is read while its servers start; one whose last entry
    # says it waits for an approval is read first, in order (docs/durability.md).
    ask = '[[policy.rules]]\ntool = "mcp:cnt:count"\neffect = "ask"\nargs = { key = { equals = "second" } }\n'
    contract = counting_contract(
        tmp_path, steps=steps, check_tool="mcp:cnt:count", contract=ask if record == "waiting_for_approval" else ""
    )
    if record == "killed":
        crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": "during_verdict"})
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr  # resumable: nothing sealed it
    else:
        waiting = truss(home, "run", str(contract), "--session", "s1")
        assert waiting.returncode == 3, waiting.stdout + waiting.stderr
    before = _head(home, "s1")
    args = ["resume", "s1"] if command == "resume" else ["run", str(contract), "--session", "s1"]
    env = dict(os.environ, TRUSS_HOME=str(home))
    env.pop("TRUSS_FAULT", None)
    code, _, rest = _signal_once_started([sys.executable, "-c", PAUSED_READ, *args], env, "reading s1\n", sig)
    assert code == 130, rest
    assert len(rest.splitlines()) == 1 and "interrupted" in rest  # one line, no traceback
    assert _head(home, "s1") == before
    assert cli(home, "ledger", "verify", "s1").returncode == 0
