"""The store conformance check for writers in several processes at once.

``check_ledger_store_across_processes(url)`` starts ``processes`` Python processes that each open
the store ``url`` names and drive ``sessions`` sessions in as many threads at once, the way a
worker drives runs: ``session_started``, turns, intents and results appended with ``expect_seq``
(some with ``durable=False``), a verdict and ``session_ended``, then a checkpoint signed as at the
end of a run. Then, in this process, it checks what every store shared by many writers must give:

- the whole log verifies (every signature, chain and seq), with exactly the entries written;
- log indexes run 0..n-1 with no gap and no duplicate;
- every stored checkpoint is signed, its root is the log's root at its size, so all of them are
  prefixes of one tree (mutually consistent), and the stored tree is the one the entries give;
- each session's checkpoint, as its worker got it, covers that session's verdict and is stored.

It raises ``AssertionError`` naming the first failure. ``url`` must name an existing, empty store
the child processes can open (a file path for SQLite, ``postgresql://...``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from truss._clock import SystemClock
from truss.ledger.audit import LogAudit
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.note import open_checkpoint
from truss.ledger.stores import LedgerStore, open_store
from truss.ledger.verification import verify_ledger

__all__ = ["PROCESS_CHECK_SEED", "check_ledger_store_across_processes", "open_store_url"]

PROCESS_CHECK_SEED = bytes(range(32))
_ORIGIN = "conformance.truss.test"

_WORKER = textwrap.dedent(
    """
    import json, sys, threading
    from truss._clock import SystemClock
    from truss.ledger.entry import Record
    from truss.ledger.keys import IdentityKey
    from truss.ledger.note import sign_checkpoint
    from truss.testing._processes import PROCESS_CHECK_SEED, open_store_url

    url, worker, sessions, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    key = IdentityKey.from_seed(PROCESS_CHECK_SEED, sys.argv[5])
    store = open_store_url(url, key=key)
    out, errors = {}, []

    def drive(n):
        session = f"s_w{worker}_{n}"
        try:
            store.append(session, [Record("session_started", {"contract": "conformance"})])
            seq = 1
            for i in range(steps):
                batch = [Record("mcp_tool_intent", {"i": i}), Record("mcp_tool_call", {"i": i})]
                store.append(session, batch, expect_seq=seq, durable=i % 3 != 1)
                seq += 2
            [verdict] = store.append(session, [Record("verdict", {"status": "pass"})], expect_seq=seq)
            store.append(session, [Record("session_ended", {"status": "pass"})], expect_seq=seq + 1)
            checkpoint = sign_checkpoint(store, key)
            out[session] = {"verdict_index": verdict.index, "note": checkpoint.note.decode()}
        except BaseException as exc:
            errors.append(f"{session}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=drive, args=(n,)) for n in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    print(json.dumps({"sessions": out, "errors": errors}))
    """
)


def open_store_url(url: str, *, key: IdentityKey | None) -> LedgerStore:
    """Open the store ``url`` names, as ``--db`` does (any registered scheme, or a SQLite path)."""
    return open_store(url, key=key, clock=SystemClock())


def check_ledger_store_across_processes(
    url: str, *, processes: int = 4, sessions: int = 4, steps: int = 10, timeout_s: float = 300
) -> None:
    """Run the several-process check against the empty store ``url`` (see the module docstring)."""
    key = IdentityKey.from_seed(PROCESS_CHECK_SEED, _ORIGIN)
    open_store_url(url, key=key).close()  # create it once, so the workers do not race to
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(w), str(sessions), str(steps), _ORIGIN],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(processes)
    ]
    results: dict[str, dict[str, object]] = {}
    failures: list[str] = []
    for child in children:
        try:
            out, err = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for other in children:
                other.kill()
                other.communicate()
            raise AssertionError(f"a writer process did not finish in {timeout_s} s") from None
        if child.returncode != 0:
            failures.append(f"exit {child.returncode}: {err.strip()[-2000:]}")
            continue
        done = json.loads(out.strip().splitlines()[-1])
        failures += done["errors"]
        results.update(done["sessions"])
    assert not failures, f"a writer failed: {failures[0]}"
    expected_sessions = processes * sessions
    assert len(results) == expected_sessions, f"{len(results)} of {expected_sessions} sessions finished"

    store = open_store_url(url, key=None)
    try:
        trusted = TrustedKeys([key.verifier])
        per_session = 1 + 2 * steps + 2
        total = expected_sessions * per_session
        audit = LogAudit(store.checkpoints(), trusted, store.origin, node=store.node)
        report = verify_ledger(store, trusted, extra=[audit.check])
        assert report.ok, f"the shared log does not verify: {report.reason}: {report.message}"
        assert report.entries == total and report.sessions == expected_sessions, f"{report}"
        size, root = store.tree_head()
        problem = audit.finish(size, root)
        assert problem is None, f"the log's checkpoints or tree do not check out: {problem}"
        indexes = [e.index for e in store.read_range(0, size + 1)]
        assert indexes == list(range(total)), "log indexes have a gap or a duplicate"
        stored = {cp.size: cp for cp in store.checkpoints()}
        assert audit.checked == len(stored), f"{audit.checked} of {len(stored)} checkpoints were matched to the log"
        for session, got in results.items():
            assert verify_ledger(store, trusted, session=session).ok, f"session {session} does not verify"
            note = str(got["note"]).encode()
            checkpoint = open_checkpoint(note, [key.verifier], origin=store.origin)
            assert checkpoint.size > int(str(got["verdict_index"])), f"{session}: its checkpoint misses its verdict"
            held = stored.get(checkpoint.size)
            assert held is not None and held.root == checkpoint.root, f"{session}: its checkpoint is not stored"
    finally:
        store.close()
