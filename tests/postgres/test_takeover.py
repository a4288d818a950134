"""A worker killed with SIGKILL mid-call on PostgreSQL, taken over by a worker on another host.

Real processes, a real PostgreSQL server and the counting server (it records every invocation it
receives, durably, before answering). The killed worker names itself host ``worker-a``
(``TRUSS_HOST``), so its lease cannot be judged by probing its pid: like a worker that died on
another machine, it binds others until it expires. ``TRUSS_LEASE`` makes that a couple of seconds
rather than 30; the test waits for the expiry by polling ``truss sessions``, bounded by a deadline.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import python_peer
from tests.durability.support import TIMEOUT, cli, counting_contract, invocations, make_home, truss
from truss._clock import SystemClock
from truss.ledger.stores.base import Lease

pytestmark = [pytest.mark.slow, pytest.mark.peers]

LEASE = "3s"
LEASE_MS = 3000


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def _status(home: Path, db: str, session: str) -> str:
    listed = json.loads(_ok(cli(home, "--db", db, "--json", "sessions")).stdout)
    return {row["id"]: row["status"] for row in listed["sessions"]}[session]


def _kinds(home: Path, db: str, session: str) -> list[str]:
    shown = json.loads(_ok(cli(home, "--db", db, "--json", "ledger", "show", session)).stdout)
    return [e["kind"] for e in shown["entries"]]


def _lease(db: str, session: str) -> Lease:
    from truss.ledger.stores import open_store

    store = open_store(db, key=None, clock=SystemClock())
    try:
        lease = store.lease(session)
        assert lease is not None
        return lease
    finally:
        store.close()


def test_a_worker_killed_mid_call_is_taken_over_by_another_host_after_its_lease_expires_and_the_call_is_in_doubt(
    tmp_path: Path, postgres_url: str
) -> None:
    python_peer("mcp-server-time")  # the peer environment the counting server runs in
    home = make_home(tmp_path / "home")
    db = postgres_url
    contract = counting_contract(
        tmp_path, steps=[("mcp:cnt:count", {"key": "first"}), ("mcp:cnt:count", {"key": "second"})],
        check_tool="mcp:cnt:count",
    )  # fmt: skip
    worker_a = {"TRUSS_DB": db, "TRUSS_HOST": "worker-a", "TRUSS_LEASE": LEASE}

    # Worker A: the first call completes; the second reaches the server, then A dies before its result.
    killed = truss(home, "run", str(contract), "--session", "s1", env={**worker_a, "TRUSS_FAULT": "during_call:2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert invocations(tmp_path) == {"count first": 1, "count second": 1}
    recorded = _kinds(home, db, "s1")
    assert recorded.count("mcp_tool_intent") == 2 and recorded.count("mcp_tool_call") == 1, recorded

    lease = _lease(db, "s1")
    assert lease.host == "worker-a" and lease.expires_ms > lease.acquired_ms, lease
    assert lease.expires_ms - lease.acquired_ms <= LEASE_MS, "TRUSS_LEASE sets the lease's length"

    # Worker B (this host, its own name): while A's lease may still bind, B is refused naming A.
    worker_b = {"TRUSS_DB": db, "TRUSS_HOST": "worker-b", "TRUSS_LEASE": LEASE}
    early = truss(home, "resume", "s1", env=worker_b)
    refused = "is being driven by" in early.stderr
    if SystemClock().now_ms() < lease.expires_ms:  # finished before the lease ran out: it had to refuse
        assert early.returncode == 3 and refused, early.stdout + early.stderr
        assert f"session s1 is being driven by pid {lease.pid} on host worker-a" in early.stderr
        assert invocations(tmp_path)["count second"] == 1, "a refused driver sends nothing"

    if refused:
        # Once A's lease expires the session is interrupted (A is on another host: its pid is not probed).
        deadline = time.monotonic() + TIMEOUT
        while _status(home, db, "s1") != "interrupted":
            assert time.monotonic() < deadline, "the dead worker's lease never expired"
        assert SystemClock().now_ms() >= lease.expires_ms
        # B takes the session over.
        resumed = _ok(truss(home, "resume", "s1", env=worker_b), 3)
    else:
        # On a loaded machine A's 3 s lease ran out before B asked: B took the session over at once.
        assert SystemClock().now_ms() >= lease.expires_ms, early.stdout + early.stderr
        resumed = _ok(early, 3)
    # The second call's intent is recorded and its result is not, and `count` is not declared safe
    # to re-send: it is in doubt, and B stops without sending it again.
    assert "in doubt    c2.0" in resumed.stdout and "truss resolve s1 c2.0" in resumed.stdout, resumed.stdout
    assert invocations(tmp_path) == {"count first": 1, "count second": 1}, "the in-doubt call was not re-sent"
    taken = _lease(db, "s1")
    assert taken.epoch > lease.epoch

    # The operator says what the server did; B finishes the run, sending nothing that completed before.
    _ok(cli(home, "--db", db, "resolve", "s1", "c2.0", "--result", '"counted second"'))
    finished = _ok(truss(home, "resume", "s1", env=worker_b))
    assert "verdict     pass" in finished.stdout, finished.stdout
    assert invocations(tmp_path) == {"count first": 1, "count second": 1}, "the server saw each call once"
    recorded = _kinds(home, db, "s1")
    assert recorded.count("in_doubt") == 1 and recorded.count("in_doubt_resolved") == 1, recorded
    assert recorded.count("verdict") == 1 and recorded[-1] == "session_ended", recorded
    assert _status(home, db, "s1") == "pass"
    _ok(cli(home, "--db", db, "ledger", "verify", "--all"))


@pytest.mark.parametrize(("name", "value"), [("TRUSS_LEASE", "soon"), ("TRUSS_LEASE", "0s"), ("TRUSS_HOST", "a\tb")])
def test_a_bad_lease_setting_in_the_environment_is_refused_with_exit_2_naming_the_variable(
    tmp_path: Path, postgres_url: str, name: str, value: str
) -> None:
    home = make_home(tmp_path / "home")
    refused = truss(home, "sessions", env={"TRUSS_DB": postgres_url, name: value})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert name in refused.stderr and "Traceback" not in refused.stderr
