"""Run 20,000 of a ledger costs what run 20 did: a run's end, ``verify SESSION`` and ``export SESSION``.

Two SQLite ledgers in the same run: one with ``--small`` (default 200) ended sessions and one with
``--large`` (default 20,000), each session four entries (started, a model turn, verdict, ended)
followed by a signed checkpoint, as ``truss run`` leaves them. Then, interleaved over
``--rounds`` rounds, on each ledger (medians; peak Python memory by ``tracemalloc``, in rounds of
its own between the timed ones, so that tracing does not inflate the times):

1. a run's end: a new session's ``verdict`` and ``session_ended`` appended durably, then
   ``sign_checkpoint`` (the latest checkpoint, a consistency proof, one signature);
2. ``truss.ledger.verify(store, trusted, session=S)`` of an early session (what
   ``truss ledger verify S`` runs);
3. ``export_bundle(store, S)`` of the same session (``truss ledger export S``).

Prints each ratio large / small (target <= 1.1 in time and memory) and the fsync state of the
disk (``bench/_disk.py``). Usage: ``python bench/scale_sessions.py [--small N] [--large N]
[--rounds R] [--db-dir DIR]``. Record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.ledger import verify  # noqa: E402
from truss.ledger.bundle import export_bundle  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import IdentityKey, TrustedKeys  # noqa: E402
from truss.ledger.merkle import root_at  # noqa: E402
from truss.ledger.note import sign_checkpoint, sign_checkpoint_note  # noqa: E402
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite  # noqa: E402

CLOCK = SystemClock()
KEY = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")


def session(i: int) -> list[Record]:
    return [
        Record("session_started", {"contract": "bench", "effective": {}}),
        Record("model_turn", {"turn": 1, "stop_reason": "end_turn"}),
        Record("verdict", {"status": "pass", "checks": []}),
        Record("session_ended", {"status": "pass"}),
    ]


def build(path: Path, sessions: int) -> SqliteStore:
    store = open_sqlite(path, key=KEY, clock=CLOCK)

    def batches() -> Iterator[tuple[str, list[Record]]]:
        for i in range(sessions):
            yield f"s_{i:06d}", session(i)

    store.bulk_append(batches(), per_txn=2000)
    for i in range(sessions):  # the checkpoint each run's end signed, as signed notes over the real roots
        size = (i + 1) * 4
        root = root_at(size, store.node)
        note = sign_checkpoint_note(store.origin, size, root, KEY).note
        assert note is not None
        store.add_checkpoint(size, root, note.decode())
    return store


def elapsed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def peak(fn: Callable[[], Any]) -> int:
    """Peak Python memory of ``fn`` (tracemalloc), in a call of its own: tracing slows what it traces."""
    tracemalloc.start()
    fn()
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top


def main(small: int, large: int, rounds: int, db_dir: str | None) -> None:
    with tempfile.TemporaryDirectory(dir=db_dir) as name:
        tmp = Path(name)
        before = fsync_state(tmp)
        start = time.perf_counter()
        stores = {small: build(tmp / "small.db", small), large: build(tmp / "large.db", large)}
        print(f"built ledgers of {small} and {large} sessions in {time.perf_counter() - start:.1f} s")
        trusted = TrustedKeys([KEY.verifier])
        times: dict[tuple[str, int], list[float]] = {}
        peaks: dict[tuple[str, int], list[int]] = {}
        for r in range(rounds * 2):  # even rounds time the operations, odd rounds trace their memory
            for n, store in stores.items():

                def run_end(store: SqliteStore = store, r: int = r) -> None:
                    sid = f"end_{r}"
                    store.append(sid, session(0)[:2])
                    store.append(sid, session(0)[2:], durable=True)
                    sign_checkpoint(store, KEY)

                def verify_one(store: SqliteStore = store) -> None:
                    assert verify(store, trusted, session="s_000007").ok

                def export_one(store: SqliteStore = store) -> None:
                    export_bundle(store, "s_000007", vkey=KEY.verifier.vkey)

                for label, fn in (("run end", run_end), ("verify SESSION", verify_one), ("export SESSION", export_one)):
                    if r % 2 == 0:
                        times.setdefault((label, n), []).append(elapsed(fn))
                    else:
                        peaks.setdefault((label, n), []).append(peak(fn))
        after = fsync_state(tmp)
        for store in stores.values():
            store.close()
    print(f"{rounds} interleaved rounds, medians; load {os.getloadavg()[0]:.2f}")
    print(f"   fsync state before: {before}")
    for label in ("run end", "verify SESSION", "export SESSION"):
        t_small, t_large = statistics.median(times[(label, small)]), statistics.median(times[(label, large)])
        m_small, m_large = statistics.median(peaks[(label, small)]), statistics.median(peaks[(label, large)])
        print(f"   {label:15s} {small:>6} sessions {t_small * 1000:8.2f} ms {m_small / 1e3:8.1f} kB | "
              f"{large:>6} sessions {t_large * 1000:8.2f} ms {m_large / 1e3:8.1f} kB | "
              f"ratio time {t_large / t_small:5.2f}x memory {m_large / m_small:5.2f}x (target <= 1.1)")  # fmt: skip
    print(f"   fsync state after:  {after}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run end, verify SESSION and export SESSION at 200 vs 20,000 runs.")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--db-dir", default=None)
    options = parser.parse_args()
    main(options.small, options.large, options.rounds, options.db_dir)
