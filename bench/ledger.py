"""Ledger benchmarks: durable append, group commit, verification, and scale to a large ledger.

Each measurement runs its baseline in the same process and prints the ratio; first, the disk's
fsync state (``bench/_disk.py``), what group commit saves per shared commit:

1. durable append latency, one writer (median and p90 of single-entry ``append`` calls);
2. 16 concurrent writers: group commit vs one transaction per append (``group_commit=False``),
   throughput in entries/s; the issue aims for >= 5x;
3. verification throughput vs a bare PyNaCl verify loop over the same signatures and signing
   payloads (aim: >= 0.7 of it), in memory (``verify_entries``) and from disk (``verify_ledger``);
4. scale: a ledger grown to ``--entries`` (default 1,000,000) with the bulk path; durable append
   latency, listing and showing one session at 1k entries vs at full size; peak RSS of
   ``truss ledger verify --all`` run as a subprocess.

Usage: ``python bench/ledger.py [--entries N] [--runs R] [--skip-scale]``. Results go to stdout;
record them in docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import nacl.signing  # noqa: E402
from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.ledger.canonical import sha256_ref  # noqa: E402
from truss.ledger.entry import Record, entry_signing_payload  # noqa: E402
from truss.ledger.keys import IdentityKey, TrustedKeys  # noqa: E402
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite  # noqa: E402
from truss.ledger.verification import verify_entries, verify_ledger  # noqa: E402

KEY = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
CLOCK = SystemClock()


def _store(path: Path, *, group: bool = True) -> SqliteStore:
    return open_sqlite(path, key=KEY, clock=CLOCK, group_commit=group)


def _turn(i: int) -> Record:
    """A realistic entry: a tool call with argument and result payloads on every other entry."""
    if i % 2:
        args = b'{"path":"/srv/work/file-%d.txt"}' % i
        result = b'{"content":[{"type":"text","text":"%s"}],"isError":false}' % (b"x" * 200)
        a, r = sha256_ref(args), sha256_ref(result)
        return Record(
            "mcp_tool_call",
            {"call": f"c{i}", "tool": "mcp:fs:read_file", "args": a, "result": r, "is_error": False, "ms": 12},
            {a: args, r: result},
        )
    return Record("model_turn", {"request": sha256_ref(b"%d" % i), "usage": {"input": 1200, "output": 80}})


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def append_latency(store: SqliteStore, session: str, n: int) -> list[float]:
    out: list[float] = []
    for i in range(n):
        t = time.perf_counter()
        store.append(session, [_turn(i)])
        out.append(time.perf_counter() - t)
    return out


def bench_append(tmp: Path, n: int) -> dict[str, float]:
    store = _store(tmp / "append.db")
    store.append("s_lat", [Record("session_started", {"contract": "bench"})])
    lat = append_latency(store, "s_lat", n)
    store.close()
    return {"median_ms": _median(lat) * 1000, "p90_ms": _p(lat, 0.9) * 1000}


def bench_concurrency(tmp: Path, *, group: bool, writers: int, per_writer: int, tag: str) -> float:
    store = _store(tmp / f"conc-{tag}.db", group=group)
    for w in range(writers):
        store.append(f"s_{w}", [Record("session_started", {"contract": "bench"})])
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        barrier.wait()
        try:
            for i in range(per_writer):
                store.append(f"s_{w}", [_turn(i)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    stats = store.stats()
    store.close()
    if errors:
        raise errors[0]
    if group:
        print(f"  group commit: {stats['batches'] / stats['commits']:.1f} appends per transaction", flush=True)
    return writers * per_writer / elapsed


def bench_separate_connections(tmp: Path, *, writers: int, per_writer: int, tag: str) -> float:
    """The naive way with no coordination: each writer its own connection, one transaction per append.

    Writers meet only in SQLite's lock, whose busy handler sleeps and retries.
    """
    path = tmp / f"sep-{tag}.db"
    _store(path).close()
    stores = [_store(path, group=False) for _ in range(writers)]
    for w, store in enumerate(stores):
        store.append(f"s_{w}", [Record("session_started", {"contract": "bench"})])
    barrier = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        barrier.wait()
        try:
            for i in range(per_writer):
                stores[w].append(f"s_{w}", [_turn(i)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for store in stores:
        store.close()
    if errors:
        raise errors[0]
    return writers * per_writer / elapsed


def _fill(store: SqliteStore, entries: int, *, per_session: int = 100, prefix: str = "s") -> None:
    def batches() -> Any:
        made = 0
        n = 0
        while made < entries:
            count = min(per_session, entries - made)
            records = [Record("session_started", {"contract": "bench"})] + [_turn(i) for i in range(1, count)]
            yield f"{prefix}_{n:07d}", records
            made += count
            n += 1

    store.bulk_append(batches(), per_txn=50)


def bench_verify(tmp: Path, entries: int) -> dict[str, float]:
    store = _store(tmp / "verify.db")
    _fill(store, entries)
    items = list(store.read_range(0, entries))
    trusted = TrustedKeys([KEY.verifier])
    vk = nacl.signing.VerifyKey(KEY.verifier.public_key)
    messages = [(entry_signing_payload(e.raw), e.sig) for e in items]

    def bare() -> None:
        for message, sig in messages:
            vk.verify(message, sig)

    def ours() -> None:
        report = verify_entries(items, trusted, full_log=True, origin=store.origin)
        assert report.ok

    def ours_disk() -> None:
        report = verify_ledger(store, trusted)
        assert report.ok

    # Interleaved, best of five each: on a shared machine a load spike then hits all three alike.
    times: dict[str, list[float]] = {"bare": [], "verify_entries": [], "verify_ledger": []}
    for _ in range(5):
        for name, fn in (("bare", bare), ("verify_entries", ours), ("verify_ledger", ours_disk)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    out = {name: entries / min(ts) for name, ts in times.items()}
    store.close()
    return out


def _time(fn: Callable[[], object], reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return _median(times)


def _interleaved(small: Callable[[], object], large: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median seconds of ``small`` and ``large``, alternating calls so load spikes hit both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(reps):
        for fn, out in ((small, a), (large, b)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return _median(a), _median(b)


def _seed(store: SqliteStore) -> None:
    """The same start for both ledgers: 100 sessions of 10 entries, a 300-entry session to show."""
    _fill(store, 1000, per_session=10)
    store.append("s_show", [Record("session_started", {"contract": "show"})] + [_turn(i) for i in range(1, 300)])
    store.append("s_probe", [Record("session_started", {"contract": "probe"})])


def bench_scale(tmp: Path, total: int) -> None:
    db = tmp / "scale.db"
    small_store, store = _store(tmp / "small.db"), _store(db)
    _seed(small_store)
    _seed(store)
    t = time.perf_counter()
    _fill(store, total - store.tree_size(), prefix="t")
    fill_s = time.perf_counter() - t
    size, small_size = store.tree_size(), small_store.tree_size()
    print(f"scale: bulk-filled {size:,} entries in {fill_s:.0f} s, file {db.stat().st_size / 1e6:.0f} MB", flush=True)
    counter = iter(range(10**9))
    probes = {
        "durable append (1 entry)": (
            lambda: small_store.append("s_probe", [_turn(next(counter))]),
            lambda: store.append("s_probe", [_turn(next(counter))]),
            300,
        ),
        "list newest 50 sessions": (lambda: small_store.sessions(limit=50), lambda: store.sessions(limit=50), 100),
        "show a 300-entry session": (
            lambda: list(small_store.read_session("s_show")),
            lambda: list(store.read_session("s_show")),
            50,
        ),
    }
    for name, (small_fn, large_fn, reps) in probes.items():
        a, b = _interleaved(small_fn, large_fn, reps)
        print(
            f"  {name}: {a * 1000:.3f} ms at {small_size:,} entries, {b * 1000:.3f} ms at {size:,}, ratio {b / a:.2f}",
            flush=True,
        )
    small_store.close()
    store.close()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "truss",
            "--home",
            str(tmp),
            "--db",
            str(db),
            "ledger",
            "verify",
            "--all",
            "--trusted-key",
            KEY.verifier.vkey,
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=7200,
    )
    verify_s = time.perf_counter() - t
    peak_kb = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    if proc.returncode != 0:
        raise SystemExit(f"verify --all failed: {proc.stdout} {proc.stderr}")
    print(f"  truss ledger verify --all: {verify_s:.0f} s, peak RSS {peak_kb / 1024:.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="scale test ledger size")
    parser.add_argument("--runs", type=int, default=3, help="repetitions of the fast benchmarks (medians)")
    parser.add_argument("--verify-entries", type=int, default=20_000)
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, sqlite {__import__('sqlite3').sqlite_version}, cpus {os.cpu_count()}")
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="truss-bench-") as d:
        tmp = Path(d)
        print(f"disk: {fsync_state(tmp)}", flush=True)
        for r in range(args.runs):
            (tmp / f"r{r}").mkdir()
            (tmp / f"v{r}").mkdir()
        lat = [bench_append(tmp / f"r{r}", 200) for r in range(args.runs)]
        print(
            f"durable append, 1 writer: median {_median([x['median_ms'] for x in lat]):.2f} ms, "
            f"p90 {_median([x['p90_ms'] for x in lat]):.2f} ms",
            flush=True,
        )
        ratios: list[float] = []
        sep_ratios: list[float] = []
        for r in range(args.runs):
            n = bench_concurrency(tmp, group=False, writers=16, per_writer=40, tag=f"n{r}")
            g = bench_concurrency(tmp, group=True, writers=16, per_writer=40, tag=f"g{r}")
            sep = bench_separate_connections(tmp, writers=16, per_writer=40, tag=f"s{r}")
            ratios.append(g / n)
            sep_ratios.append(g / sep)
            print(
                f"16 writers: group commit {g:,.0f} entries/s; one txn per append, shared connection {n:,.0f}/s, "
                f"own connections {sep:,.0f}/s",
                flush=True,
            )
        print(
            f"16 writers, group commit vs one txn per append: shared connection {_median(ratios):.1f}x "
            f"(runs {', '.join(f'{x:.1f}' for x in ratios)}), own connections {_median(sep_ratios):.1f}x "
            f"(runs {', '.join(f'{x:.1f}' for x in sep_ratios)})",
            flush=True,
        )
        mem_r: list[float] = []
        disk_r: list[float] = []
        for r in range(args.runs):
            v = bench_verify(tmp / f"v{r}", args.verify_entries)
            mem_r.append(v["verify_entries"] / v["bare"])
            disk_r.append(v["verify_ledger"] / v["bare"])
            print(
                f"verify {args.verify_entries} entries: bare PyNaCl loop {v['bare']:,.0f}/s, verify_entries "
                f"{v['verify_entries']:,.0f}/s, from SQLite with payloads {v['verify_ledger']:,.0f}/s",
                flush=True,
            )
        print(
            f"verify vs bare loop, median of runs: in memory {_median(mem_r):.2f}, from SQLite {_median(disk_r):.2f}",
            flush=True,
        )
        if not args.skip_scale:
            bench_scale(tmp, args.entries)


if __name__ == "__main__":
    main()
