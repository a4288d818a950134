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

__all__ = ["BareDisk", "DiskState", "fsync_state"]


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


class BareDisk:
    """A bare fsync of a small append and a bare synchronous SQLite WAL commit of one row, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._fd = os.open(directory / "bare-fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._db = sqlite3.connect(directory / "bare-commit.db", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")

    def fsync(self) -> None:
        os.write(self._fd, b"x" * 128)
        os.fsync(self._fd)

    def commit(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 128,))
        self._db.execute("COMMIT")

    def close(self) -> None:
        os.close(self._fd)
        self._db.close()


def fsync_state(directory: Path, n: int = 40) -> DiskState:
    """Bare fsync and bare synchronous commit costs in ``directory``, medians of ``n`` each, interleaved."""
    with tempfile.TemporaryDirectory(dir=directory) as name:
        disk = BareDisk(Path(name))
        flushes: list[float] = []
        commits: list[float] = []
        try:
            for _ in range(n):
                for op, out in ((disk.fsync, flushes), (disk.commit, commits)):
                    start = time.perf_counter()
                    op()
                    out.append(time.perf_counter() - start)
        finally:
            disk.close()
    return DiskState(statistics.median(flushes) * 1000.0, statistics.median(commits) * 1000.0)
