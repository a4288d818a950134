"""Verified reads at scale, and what the session lease costs a run.

Every measurement runs its baseline in the same process and prints the ratio:

1. ``truss ledger show SESSION`` (a 300-entry session) and ``truss sessions`` (the newest 50) as
   processes, against a 1,000-entry ledger and against one grown to ``--entries`` (default
   1,000,000) with the bulk path; the two ledgers are called alternately so a load spike hits
   both alike. Both read through the verified reader: ``show`` verifies the session's chain
   (signatures, seq, prev, payload hashes, its Merkle inclusion), ``sessions`` each listed row at
   its first and last entry, so neither should grow with the ledger. The same reads in process
   (``VerifiedStore.read_session``, ``VerifiedStore.sessions``) take out the interpreter start.
2. the lease's share of ``truss run contracts/hello.toml``: the median run (as a process), and the
   median cost of what the run does for its lease on the same ledger file (one durable acquire
   and one durable release; a run shorter than the 10 s renewal period renews never; the epoch
   check of each append is inside the append's own transaction), with the fsync state of the
   disk measured next to that ledger (``bench/_disk.py``).

Usage: ``python bench/verified_reads.py [--entries N] [--runs R]``; part 2 needs ``make peers``.
Results go to stdout; record them in docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import IdentityKey, TrustedKeys  # noqa: E402
from truss.ledger.reader import VerifiedStore  # noqa: E402
from truss.ledger.stores.base import LeaseOwner  # noqa: E402
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite  # noqa: E402

CLOCK = SystemClock()
PY = sys.executable
PEERS_BIN = REPO / ".peers" / "py" / "bin"


def _ledger_bench() -> Any:
    """bench/ledger.py (its realistic entries and bulk fill), loaded as a module."""
    spec = importlib.util.spec_from_file_location("bench_ledger", Path(__file__).with_name("ledger.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LEDGER = _ledger_bench()


def _home(path: Path) -> tuple[IdentityKey, SqliteStore]:
    path.mkdir(mode=0o700)
    key = IdentityKey.create(path / "identity.key", "bench.truss.test")
    return key, open_sqlite(path / "ledger.db", key=key, clock=CLOCK)


def _seed(store: SqliteStore) -> None:
    """The same start for both ledgers: 100 sessions of 10 entries and a 300-entry session to show."""
    LEDGER._fill(store, 1000, per_session=10)  # pyright: ignore[reportPrivateUsage]
    turns = [LEDGER._turn(i) for i in range(1, 300)]  # pyright: ignore[reportPrivateUsage]
    store.append("s_show", [Record("session_started", {"contract": "show"}), *turns])


_interleaved = LEDGER._interleaved  # pyright: ignore[reportPrivateUsage]  (alternating calls, medians)


def _cli(home: Path, *args: str) -> Callable[[], object]:
    env = dict(os.environ, TRUSS_HOME=str(home))

    def call() -> object:
        done = subprocess.run(
            [PY, "-m", "truss", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"truss {' '.join(args)} failed ({done.returncode}): {done.stdout} {done.stderr}")
        return done

    return call


def bench_reads(tmp: Path, total: int, runs: int) -> None:
    small_key, small = _home(tmp / "small")
    large_key, large = _home(tmp / "large")
    _seed(small)
    _seed(large)
    t = time.perf_counter()
    LEDGER._fill(large, total - large.tree_size(), prefix="t")  # pyright: ignore[reportPrivateUsage]
    fill_s = time.perf_counter() - t
    size, small_size = large.tree_size(), small.tree_size()
    print(f"bulk-filled {size:,} entries ({len(large.sessions()):,} sessions) in {fill_s:.0f} s", flush=True)
    vs = VerifiedStore(small, TrustedKeys([small_key.verifier]))
    vl = VerifiedStore(large, TrustedKeys([large_key.verifier]))
    probes: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "in process: verified read of the 300-entry session": (
            lambda: list(vs.read_session("s_show")),
            lambda: list(vl.read_session("s_show")),
            20 * runs,
        ),
        "in process: verified listing, newest 50 sessions": (
            lambda: vs.sessions(limit=50),
            lambda: vl.sessions(limit=50),
            20 * runs,
        ),
    }
    for name, (small_fn, large_fn, reps) in probes.items():
        a, b = _interleaved(small_fn, large_fn, reps)
        print(f"  {name}: {a * 1000:.2f} ms at {small_size:,}, {b * 1000:.2f} ms at {size:,}, ratio {b / a:.2f}")
    vs.close()
    vl.close()
    cli = {
        "`truss ledger show s_show --json`": ("ledger", "show", "s_show", "--json"),
        "`truss sessions --json` (newest 50)": ("--json", "sessions"),
    }
    for name, args in cli.items():
        a, b = _interleaved(_cli(tmp / "small", *args), _cli(tmp / "large", *args), 2 * runs + 1)
        print(f"  {name}: {a * 1000:.0f} ms at {small_size:,}, {b * 1000:.0f} ms at {size:,}, ratio {b / a:.2f}")


def bench_lease(tmp: Path, runs: int) -> None:
    server = PEERS_BIN / "mcp-server-time"
    if not server.exists():
        print("lease share: skipped, mcp-server-time is not installed (make peers)")
        return
    home = tmp / "run-home"
    env = dict(os.environ, TRUSS_HOME=str(home), PATH=f"{PEERS_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    init = subprocess.run([PY, "-m", "truss", "init"], env=env, capture_output=True, timeout=120, check=False)
    assert init.returncode == 0, init.stderr
    run_cmd = [PY, "-m", "truss", "run", "contracts/hello.toml", "--json"]
    subprocess.run(run_cmd, env=env, cwd=REPO, capture_output=True, timeout=120, check=True)  # warm caches
    key = IdentityKey.load(home / "identity.key")
    copy = tmp / "lease-ledger.db"
    disk = fsync_state(tmp)
    run_s: list[float] = []
    lease_s: list[float] = []
    for r in range(runs):
        t = time.perf_counter()
        subprocess.run(run_cmd, env=env, cwd=REPO, capture_output=True, timeout=120, check=True)
        run_s.append(time.perf_counter() - t)
        shutil.copy(home / "ledger.db", copy)  # the same file as the run's, on the same disk
        store = open_sqlite(copy, key=key, clock=CLOCK)
        owner = LeaseOwner.this_process(f"bench-{r}")
        each: list[float] = []
        for i in range(20):
            t = time.perf_counter()
            lease = store.acquire_lease(f"s_lease_{i}", owner)
            store.release_lease(lease)
            each.append(time.perf_counter() - t)
        store.close()
        copy.unlink()
        lease_s.append(statistics.median(each))
    run_m, lease_m = statistics.median(run_s), statistics.median(lease_s)
    print(
        f"lease share of `truss run contracts/hello.toml`: run {run_m * 1000:.0f} ms (median of {runs}), "
        f"acquire + release {lease_m * 1000:.2f} ms, share {lease_m / run_m * 100:.2f} %"
    )
    print(f"  disk: {disk}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-reads", action="store_true")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="truss-bench-verified-") as d:
        tmp = Path(d)
        bench_lease(tmp, 5 * args.runs)
        if not args.skip_reads:
            bench_reads(tmp, args.entries, args.runs)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
