"""Many workers, one PostgreSQL ledger: 4 processes, each driving 4 runs at once, append to one log.

Each worker process opens the ledger through the public API (``truss.Runtime.open`` with a
``postgresql://`` URL) and runs the same contract 4 times concurrently against real stdio servers
(the counting server, which records every call it receives). Afterwards, in this process:
every run passed, every chain verifies, the log has no gap and no duplicate index, every stored
checkpoint is a prefix of the one tree (so all are mutually consistent), each run's anchor
checkpoint covers its verdict, and the servers saw each call exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.durability.support import counting_contract, invocations, make_home
from truss._clock import SystemClock
from truss.ledger.audit import verify_store
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.note import open_checkpoint
from truss.ledger.stores import open_store

pytestmark = pytest.mark.slow

PROCESSES, RUNS, CALLS = 4, 4, 3

_WORKER = textwrap.dedent(
    """
    import json, sys
    import anyio
    import truss
    from truss.mcp import connect

    home, url, contract_path, tag, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

    async def main(runtime, contract):
        outcomes = {}

        async def one(n):
            outcome = await truss.run_contract(runtime, contract, session_id=f"s-{tag}-{n}")
            outcomes[outcome.session] = {"status": outcome.status, "checkpoint": outcome.checkpoint}

        async with anyio.create_task_group() as group:
            for n in range(runs):
                group.start_soon(one, n)
        return outcomes

    with truss.Runtime.open(home=home, db=url, create=True, connector=connect) as runtime:
        contract = truss.load_contract(contract_path, home=runtime.home)
        print(json.dumps(anyio.run(main, runtime, contract)))
    """
)


def test_four_processes_of_four_concurrent_runs_share_one_postgresql_log(tmp_path: Path, postgres_url: str) -> None:
    home = make_home(tmp_path / "home")
    key = IdentityKey.load(home / "identity.key")
    steps = [("mcp:cnt:count", {"key": f"k{i}"}) for i in range(CALLS)]
    contract = counting_contract(tmp_path, steps=steps, check_tool="mcp:cnt:count")
    open_store(postgres_url, key=key, clock=SystemClock()).close()  # created once, before the race
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(home), postgres_url, str(contract), f"w{w}", str(RUNS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(PROCESSES)
    ]
    outcomes: dict[str, dict[str, str]] = {}
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-3000:]
        outcomes.update(json.loads(out.strip().splitlines()[-1]))
    assert len(outcomes) == PROCESSES * RUNS
    assert {o["status"] for o in outcomes.values()} == {"pass"}
    assert sum(invocations(tmp_path).values()) == PROCESSES * RUNS * CALLS, "each call reached a server once"

    store = open_store(postgres_url, key=None, clock=SystemClock(), create=False)
    try:
        trusted = TrustedKeys([key.verifier])
        whole = verify_store(store, trusted)  # chains, indexes, the Merkle tree and every checkpoint
        assert whole.ok, whole
        assert whole.sessions == PROCESSES * RUNS
        size = store.tree_size()
        assert [e.index for e in store.read_range(0, size + 10)] == list(range(size)), "no gap, no duplicate"
        stored = {cp.size: cp.root for cp in store.checkpoints()}
        for session, outcome in outcomes.items():
            assert verify_store(store, trusted, session=session).ok, session
            verdict = next(e for e in store.read_session(session) if e.kind == "verdict")
            anchor = open_checkpoint(outcome["checkpoint"].encode(), [key.verifier], origin=store.origin)
            assert anchor.size > verdict.index, f"{session}: its checkpoint does not include its verdict"
            assert stored.get(anchor.size) == anchor.root, f"{session}: its checkpoint is not the stored one"
    finally:
        store.close()
