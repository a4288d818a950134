"""What each write of a durable SQLite append costs, and what candidate layouts would save.

Command: ``.venv/bin/python bench/append_layout.py --db-dir /dev/shm --appends 3000 --rounds 5``

Outside Truss, on plain ``sqlite3`` connections (WAL, ``synchronous=FULL``, the store's own
pragmas), one transaction per append with the statements the store runs for one entry that
carries one new payload (``BEGIN IMMEDIATE``, ``PRAGMA data_version``, then the rows, ``COMMIT``);
process CPU per transaction and WAL pages per commit, one fresh file per layout and round, the
layouts alternating within each round; medians. The rows are the shapes an audited call's two
entries have (a ~500-byte signed entry, a 150-byte payload, one Merkle leaf).

Layouts (``steps``: which writes of schema 2 run, cumulatively, so their differences are each
write's share):

- ``txn``: the transaction alone; ``+entry``: the entry row and its ``(session, seq)`` index;
  ``+node``: its Merkle leaf; ``+blob``: the payload in ``blobs``; ``+link``: its
  ``session_blobs`` row and the by-ref index; ``schema 2`` adds the session row's ``UPDATE``:
  what the store writes today;
- ``inline+refs``: a candidate: the payload in the entry's row, a narrow ``(ref, idx)`` table
  for content-addressed reads, the session row's ``UPDATE`` kept;
- ``inline+refkey``: the same with an integer prefix of the ref in the entry's row and a partial
  index on it (one payload per entry);
- ``payload row``: the entry row unchanged, the payload in a ``payloads`` row keyed by the
  entry's log index and the ref (so it lands on the table's last page, as the entry does), and an
  index by ref for content-addressed reads.

Needs no server and no Truss key. Prints the fsync state of ``--db-dir`` (``bench/_disk.py``) and
the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _disk import fsync_state

_SCHEMA_2 = """
CREATE TABLE entries (idx INTEGER PRIMARY KEY, session TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
    ts INTEGER NOT NULL, hash BLOB NOT NULL, raw BLOB NOT NULL, sig BLOB NOT NULL, keyid TEXT NOT NULL,
    UNIQUE (session, seq));
CREATE TABLE sessions (id TEXT PRIMARY KEY, contract TEXT, principal TEXT, status TEXT NOT NULL,
    entries INTEGER NOT NULL, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, head BLOB NOT NULL,
    ended INTEGER NOT NULL DEFAULT 0, envelope BLOB) WITHOUT ROWID;
CREATE INDEX sessions_by_start ON sessions (started_ms, id);
CREATE TABLE blobs (ref TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE session_blobs (session TEXT NOT NULL, ref TEXT NOT NULL, PRIMARY KEY (session, ref)) WITHOUT ROWID;
CREATE INDEX session_blobs_by_ref ON session_blobs (ref);
CREATE TABLE nodes (last INTEGER NOT NULL, level INTEGER NOT NULL, hash BLOB NOT NULL,
    PRIMARY KEY (last, level)) WITHOUT ROWID;
"""
_CANDIDATES = """
CREATE TABLE entries_inline (idx INTEGER PRIMARY KEY, session TEXT NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, ts INTEGER NOT NULL, hash BLOB NOT NULL, raw BLOB NOT NULL, sig BLOB NOT NULL,
    keyid TEXT NOT NULL, payload BLOB, refkey INTEGER, UNIQUE (session, seq));
CREATE INDEX entries_inline_by_refkey ON entries_inline (refkey) WHERE refkey IS NOT NULL;
CREATE TABLE payload_refs (ref TEXT NOT NULL, idx INTEGER NOT NULL, PRIMARY KEY (ref, idx)) WITHOUT ROWID;
CREATE TABLE payloads (idx INTEGER NOT NULL, ref TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (idx, ref)) WITHOUT ROWID;
CREATE INDEX payloads_by_ref ON payloads (ref);
"""
_SESSION = "s_" + "0" * 30
RAW, SIG = os.urandom(500), os.urandom(64)  # a signed entry's bytes and its signature, as stored
_ENTRY = "INSERT INTO entries (idx, session, seq, kind, ts, hash, raw, sig, keyid) VALUES (?,?,?,?,?,?,?,?,?)"
_INLINE = (
    "INSERT INTO entries_inline (idx, session, seq, kind, ts, hash, raw, sig, keyid, payload, refkey)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_UPDATE = "UPDATE sessions SET entries = ?, head = ?, updated_ms = ?, ended = ?, status = ? WHERE id = ?"

Write = Callable[[sqlite3.Connection, int, bytes, str, bytes], None]


def _entry(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute(_ENTRY, (i, _SESSION, i, "mcp_tool_call", i, h, RAW, SIG, "0a1b2c3d"))


def _node(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute("INSERT INTO nodes (last, level, hash) VALUES (?,?,?)", (i, 0, h))


def _blob(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute("INSERT OR IGNORE INTO blobs (ref, data) VALUES (?,?)", (ref, data))


def _link(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute("INSERT OR IGNORE INTO session_blobs (session, ref) VALUES (?,?)", (_SESSION, ref))


def _update(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute(_UPDATE, (i + 1, h, i, 0, "running", _SESSION))


def _inline_refs(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute(_INLINE, (i, _SESSION, i, "mcp_tool_call", i, h, RAW, SIG, "0a1b2c3d", data, None))
    c.execute("INSERT INTO payload_refs (ref, idx) VALUES (?,?)", (ref, i))


def _inline_refkey(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    refkey = int.from_bytes(h[:8], "big", signed=True)
    c.execute(_INLINE, (i, _SESSION, i, "mcp_tool_call", i, h, RAW, SIG, "0a1b2c3d", data, refkey))


def _payload_row(c: sqlite3.Connection, i: int, h: bytes, ref: str, data: bytes) -> None:
    c.execute("INSERT INTO payloads (idx, ref, data) VALUES (?,?,?)", (i, ref, data))


LAYOUTS: dict[str, list[Write]] = {
    "txn": [],
    "+entry": [_entry],
    "+node": [_entry, _node],
    "+blob": [_entry, _node, _blob],
    "+link": [_entry, _node, _blob, _link],
    "schema 2": [_entry, _node, _blob, _link, _update],
    "inline+refs": [_inline_refs, _node, _update],
    "inline+refkey": [_inline_refkey, _node, _update],
    "payload row": [_entry, _node, _payload_row, _update],
}


def measure(db_dir: Path, writes: list[Write], appends: int) -> tuple[float, float]:
    """CPU µs per append transaction and WAL pages per commit, on a fresh file."""
    with tempfile.TemporaryDirectory(dir=db_dir) as tmp:
        path = Path(tmp) / "layout.db"
        c = sqlite3.connect(str(path), isolation_level=None)
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = FULL")
        c.executescript(_SCHEMA_2 + _CANDIDATES)
        c.execute("INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,NULL)", (_SESSION, "c", None, "running", 0, 1, 1,
                                                                          b"0" * 32, 0))  # fmt: skip
        digests = [hashlib.sha256(b"%d" % i).digest() for i in range(appends)]
        payloads = [os.urandom(150) for _ in range(appends)]
        c.execute("PRAGMA wal_autocheckpoint = 0")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = int(c.execute("PRAGMA page_size").fetchone()[0])
        start = time.process_time()
        for i in range(appends):
            h, data = digests[i], payloads[i]
            ref = "sha256:" + h.hex()
            c.execute("BEGIN IMMEDIATE")
            c.execute("PRAGMA data_version").fetchone()
            for write in writes:
                write(c, i, h, ref, data)
            c.execute("COMMIT")
        cpu = (time.process_time() - start) / appends * 1e6
        frames = (Path(tmp) / "layout.db-wal").stat().st_size / (page + 24) / appends
        c.close()
        return cpu, frames


def main() -> None:
    parser = argparse.ArgumentParser(description="SQL cost of one durable append, per write and per layout")
    parser.add_argument("--db-dir", default=None, help="where the files go (a RAM file system: /dev/shm)")
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    db_dir = Path(args.db_dir or tempfile.gettempdir())
    state = fsync_state(db_dir)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, writes in LAYOUTS.items():
            results[name].append(measure(db_dir, writes, args.appends))
    print(f"one durable append's SQL, {args.appends} appends x {args.rounds} rounds (medians):")
    base = statistics.median(cpu for cpu, _ in results["schema 2"])
    for name, rows in results.items():
        cpu = statistics.median(r[0] for r in rows)
        pages = statistics.median(r[1] for r in rows)
        runs = ", ".join(f"{r[0]:.1f}" for r in rows)
        print(f"  {name:14s} CPU {cpu:6.1f} us ({cpu / base:.2f}x schema 2), {pages:.2f} WAL pages  [{runs}]")
    print(f"  {state}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
