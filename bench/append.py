"""The SQLite append alone: process CPU and wall time per durable append of an audited call.

Each audited call appends two entries, each in its own durable transaction: the intent (a
``mcp_tool_intent`` with its arguments' payload) and the result (a ``mcp_tool_call`` with the
result's payload), as the gate does. This measures ``SqliteStore.append`` of those two on a
ledger already holding ``--prefill`` entries, in a child process per round, so the code measured
can be another checkout (``--baseline DIR``: the tree whose ``truss`` is the baseline, measured in
the same run, rounds alternating with the current tree). Prints the medians over rounds, the
ratio, the fsync state of ``--db-dir`` (``bench/_disk.py``) and the load average.

Usage: ``python bench/append.py [--baseline DIR] [--db-dir DIR] [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(code: Path, db_dir: Path, calls: int, prefill: int) -> dict[str, float]:
    sys.path.insert(0, str(code))
    from truss._clock import SystemClock
    from truss.ledger.canonical import sha256_ref
    from truss.ledger.entry import Record
    from truss.ledger.keys import IdentityKey
    from truss.ledger.stores.sqlite import open_sqlite

    key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
    with tempfile.TemporaryDirectory(dir=db_dir) as tmp:
        store = open_sqlite(Path(tmp) / "ledger.db", key=key, clock=SystemClock())

        def pair(session: str, i: int) -> tuple[Record, Record]:
            args = b'{"path":"/srv/work/file-%d.txt"}' % i
            result = b'{"content":[{"type":"text","text":"%d %s"}],"isError":false}' % (i, b"x" * 200)
            a, r = sha256_ref(args), sha256_ref(result)
            intent = Record(
                "mcp_tool_intent",
                {"call": f"c{i}", "turn": i, "tool": "mcp:time:get_current_time", "args": a, "pin": "p" * 16},
                {a: args},
            )
            call = Record(
                "mcp_tool_call",
                {"call": f"c{i}", "tool": "mcp:time:get_current_time", "result": r, "is_error": False, "ms": 1},
                {r: result},
            )
            return intent, call

        sessions = [f"s_{n}" for n in range(max(1, prefill // 1000))]
        batches = [(s, [Record("session_started", {"contract": "bench"})]) for s in sessions]
        per = max(0, prefill - len(sessions)) // (2 * len(sessions))
        batches += [(s, list(pair(s, i))) for i in range(per) for s in sessions]
        store.bulk_append(batches, per_txn=500)
        session = "s_live"
        store.append(session, [Record("session_started", {"contract": "bench"})])
        for i in range(50):  # warm-up: caches, the writer's frontier and head
            for record in pair(session, -i - 1):
                store.append(session, [record])
        # WAL frames per append: no automatic checkpoint while measuring, so the WAL holds them all.
        conn = store._writer.connection
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = Path(tmp) / "ledger.db-wal"
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        cpu: list[float] = []
        wall: list[float] = []
        for i in range(calls):
            intent, call = pair(session, i)
            c, w = time.process_time(), time.perf_counter()
            store.append(session, [intent])
            store.append(session, [call])
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        frames = wal.stat().st_size / (page + 24) / (2 * calls)
        schema = int(conn.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()[0])
        store.close()
    return {
        "cpu_ms": statistics.median(cpu) * 500,
        "wall_ms": statistics.median(wall) * 500,
        "pages": frames,
        "schema": schema,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The SQLite append alone, against a baseline checkout.")
    parser.add_argument("--baseline", type=Path, help="a checkout whose truss is the baseline")
    parser.add_argument("--db-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prefill", type=int, default=20_000, help="entries in the ledger before measuring")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.db_dir, args.calls, args.prefill)))
        return
    sys.path.insert(0, str(REPO / "bench"))
    from _disk import fsync_state

    trees = [("current", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for name, code in order:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(code), "--db-dir", str(args.db_dir),
                 "--calls", str(args.calls), "--prefill", str(args.prefill)],
                check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(code)},
            )  # fmt: skip
            results[name].append(json.loads(out.stdout))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    print(f"disk ({args.db_dir}): {fsync_state(args.db_dir)}; load average {' '.join(load)}")
    medians = {
        name: {k: statistics.median(r[k] for r in rows) for k in ("cpu_ms", "wall_ms", "pages", "schema")}
        for name, rows in results.items()
    }
    for name, m in medians.items():
        print(
            f"  {name:9s} (schema {m['schema']:.0f}) per append: CPU {m['cpu_ms']:.3f} ms, wall {m['wall_ms']:.3f} ms,"
            f" {m['pages']:.2f} WAL pages (median of {args.rounds} rounds)"
        )
    if "baseline" in medians:
        b, c = medians["baseline"], medians["current"]
        print(f"  current / baseline: CPU {c['cpu_ms'] / b['cpu_ms']:.2f}x, wall {c['wall_ms'] / b['wall_ms']:.2f}x")


if __name__ == "__main__":
    main()
