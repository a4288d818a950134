"""The fsync state of the disk a benchmark runs on, measured in the same run as the benchmark.

The flush cost of a shared disk is not steady: most of the time an fsync takes a fraction of a
millisecond, but for stretches every flush takes several. A ratio measured in a slow stretch says
more about the disk than about Truss, so every benchmark that commits prints, next to its ratios,
what a bare fsync of a small write and a bare synchronous SQLite commit (WAL, ``synchronous=FULL``,
one small row: the least a durable ledger append can pay) cost in the directory it used, and uses
the commit to print the floor of an audited call (the raw call plus the commits its mode needs).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskState", "fsync_state"]


@dataclass(frozen=True)
class DiskState:
    fsync_ms: float  # median of a bare fsync of a 128-byte append
    commit_ms: float  # median of a bare synchronous SQLite WAL commit of one row

    @property
    def slow(self) -> bool:
        # The slow stretches this disk shows make every flush cost ~4 ms; the normal state is < 0.5 ms.
        return self.commit_ms > 1.5

    def __str__(self) -> str:
        state = "SLOW disk stretch" if self.slow else "normal"
        return f"fsync {self.fsync_ms:.3f} ms, synchronous SQLite commit {self.commit_ms:.3f} ms ({state})"


def fsync_state(directory: Path, n: int = 40) -> DiskState:
    """Bare fsync and bare synchronous commit costs in ``directory``, medians of ``n`` each, interleaved."""
    with tempfile.TemporaryDirectory(dir=directory) as name:
        tmp = Path(name)
        fd = os.open(tmp / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        db = sqlite3.connect(tmp / "commit.db", isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
            flushes: list[float] = []
            commits: list[float] = []
            for _ in range(n):
                start = time.perf_counter()
                os.write(fd, b"x" * 128)
                os.fsync(fd)
                flushes.append(time.perf_counter() - start)
                start = time.perf_counter()
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 128,))
                db.execute("COMMIT")
                commits.append(time.perf_counter() - start)
        finally:
            os.close(fd)
            db.close()
    return DiskState(statistics.median(flushes) * 1000.0, statistics.median(commits) * 1000.0)
