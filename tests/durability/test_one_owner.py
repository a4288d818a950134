"""One owner per session: a second driver is refused naming the owner, a dead owner leaves the
session interrupted and resumable, and a stale owner's append is fenced off after a takeover.

Real processes against the counting server (it records every invocation it receives).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import python_peer
from tests.durability.support import TIMEOUT, counting_contract, invocations, make_home, truss
from truss._clock import SystemClock
from truss._errors import StoreConflictError
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store

# Takes the session's lease as a live driver would, says so, and holds it until its stdin closes.
_HOLDER = """
import sys
from pathlib import Path
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.ledger.stores.base import LeaseOwner
home, session = Path(sys.argv[1]), sys.argv[2]
store = open_store(home / "ledger.db", key=IdentityKey.load(home / "identity.key"), clock=SystemClock())
lease = store.acquire_lease(session, LeaseOwner.this_process("own_holder"), ttl_ms=600_000)
print(lease.epoch, flush=True)
sys.stdin.read()
"""


def _sessions(home: Path) -> dict[str, str]:
    listed = truss(home, "--json", "sessions")
    assert listed.returncode == 0, listed.stderr
    return {row["id"]: row["status"] for row in json.loads(listed.stdout)["sessions"]}


@pytest.mark.peers
def test_a_killed_run_is_interrupted_a_second_driver_is_refused_and_a_stale_owner_is_fenced(tmp_path: Path) -> None:
    python_peer("mcp-server-time")
    home = make_home(tmp_path / "home")
    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    killed = truss(home, "run", str(contract), "--session", "c1", env={"TRUSS_FAULT": "after_result"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert invocations(tmp_path)["count a"] == 1
    # Its pid is gone on this host: nobody drives it, so it is listed interrupted, not running.
    assert _sessions(home)["c1"] == "interrupted"

    holder = subprocess.Popen(  # a live driver on this host holds the session
        [sys.executable, "-c", _HOLDER, str(home), "c1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        epoch = int(holder.stdout.readline())
        assert _sessions(home)["c1"] == "running"
        second = truss(home, "resume", "c1")
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"session c1 is being driven by pid {holder.pid} on host" in second.stderr
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
        holder.stdout.close()
    assert _sessions(home)["c1"] == "interrupted"

    resumed = truss(home, "resume", "c1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert invocations(tmp_path)["count a"] == 1, "the resume took the recorded result: the server saw one call"
    assert _sessions(home)["c1"] == "pass"

    # The holder's epoch is stale now: the store refuses its append (fencing).
    store = open_store(home / "ledger.db", key=IdentityKey.load(home / "identity.key"), clock=SystemClock())
    try:
        lease = store.lease("c1")
        assert lease is not None and lease.epoch == epoch + 1
        with pytest.raises(StoreConflictError) as refused:
            store.append("x1", [Record("session_started", {})], epoch=epoch)  # no lease on x1 at all
        assert refused.value.fields.get("reason") == "stale_epoch"
        with pytest.raises(StoreConflictError) as stale:
            store.append("c1", [Record("model_turn", {})], epoch=epoch)
        assert stale.value.fields.get("reason") == "stale_epoch"
    finally:
        store.close()
    verify = truss(home, "ledger", "verify", "--all")
    assert verify.returncode == 0, verify.stdout + verify.stderr
