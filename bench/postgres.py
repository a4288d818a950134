"""The PostgreSQL store: an audited call vs SQLite's, scaling over worker processes, a 1,000,000-entry log.

Starts its own PostgreSQL server (the Debian package's binaries, as the tests do, on a Unix
socket in a temporary directory; ``--url`` uses another), and measures in the same run:

0. baselines: the disk's fsync state (``bench/_disk.py``: a bare fsync of a small write and a bare
   synchronous SQLite commit, what a durable SQLite commit pays at least) and a bare durable
   one-row INSERT on the server (what any durable PostgreSQL commit pays);
1. one worker's audited call: ``Gate.call`` (policy, budget, intent and result each committed
   durably and signed) over an in-process transport that answers at once, so the ledger is what
   is measured; SQLite and PostgreSQL in interleaved rounds, medians per call and the ratio;
2. aggregate audited calls per second with 1, 2, 4 and 8 worker processes on one PostgreSQL log,
   each worker driving ``--concurrent`` runs at once whose tool answers after ``--server-ms``
   (so calls overlap as with a real server: group commit within the process, the tree row lock
   between processes); the speed-up over one worker shows where the curve flattens;
3. scale: a log grown to ``--entries`` (default 1,000,000) with ``bulk_append`` and a log of
   1,000 entries, seeded alike; a durable single-entry append and ``truss ledger show`` of a
   300-entry session (the CLI as a subprocess) on both, interleaved; the ratio is the target
   (at most 1.2).

Usage: ``python bench/postgres.py [--calls N] [--rounds R] [--entries N] [--skip-scale]
[--url postgresql://...]``. Results go to stdout; record them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402

from tests._services.postgres import TempPostgres, find_bindir  # noqa: E402
from truss._clock import SystemClock  # noqa: E402
from truss.budget import BudgetState  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.gate import CallRequest, Gate, Journal, Redactor  # noqa: E402
from truss.ledger.canonical import sha256_ref  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import IdentityKey, write_identity_key  # noqa: E402
from truss.ledger.store import open_store  # noqa: E402
from truss.ledger.stores.postgresql import open_postgresql, parse_postgres_url  # noqa: E402
from truss.testing import FakeTransport, mounted_tool, text_result  # noqa: E402

KEY = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
CLOCK = SystemClock()
TOOL = mounted_tool("time", "get_current_time", annotations={"readOnlyHint": True})
RESULT = text_result('{"timezone":"UTC","datetime":"2026-12-01T10:00:00+00:00","is_dst":false}')


def contract() -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "bench-postgres", "intent": "benchmark"},
            "budget": {"max_tool_calls": 10_000_000, "deadline": "10h", "call_timeout": "30s"},
            "policy": {"default": "allow"},
            "ledger": {"durability": "power"},
            "mcp": {"servers": [{"name": "time", "command": "unused", "allow_tools": ["get_current_time"]}]},
        }
    )


class Audited:
    """A gate recording into ``store``; the transport answers at once with a recorded result."""

    def __init__(self, store: Any, session: str, c: Contract, server_ms: float = 0) -> None:
        async def answer(tool: Any, arguments: Any) -> Any:
            if server_ms:
                await anyio.sleep(server_ms / 1000)
            return RESULT

        transport = FakeTransport(answer, tools=[TOOL])
        store.append(session, [Record("session_started", {"contract": c.contract.name})])
        self.gate = Gate(
            contract=c,
            journal=Journal(store, session),
            transport=transport,
            tools=transport.tools,
            clock=CLOCK,
            budget=BudgetState.start(CLOCK.now_ms()),
            redactor=Redactor(c, {}),
        )
        self.transport = transport
        self.n = 0

    async def call(self) -> None:
        self.n += 1
        self.transport.calls.clear()
        outcome = await self.gate.call(CallRequest(f"c{self.n}.0", TOOL.name, {"timezone": "UTC"}, self.n))
        assert outcome.outcome == "ok", outcome


async def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return out


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms"


def bare_commit_ms(url: str) -> float:
    import psycopg

    with psycopg.connect(parse_postgres_url(url).conninfo, autocommit=True) as conn:
        conn.execute("SET synchronous_commit TO on")
        conn.execute("CREATE TABLE IF NOT EXISTS public.bench_probe (n int)")
        times: list[float] = []
        for i in range(200):
            start = time.perf_counter()
            conn.execute("INSERT INTO public.bench_probe VALUES (%s)", (i,))
            times.append(time.perf_counter() - start)
        conn.execute("DROP TABLE public.bench_probe")
    return statistics.median(times) * 1000


async def audited_call(tmp: Path, url: str, calls: int, rounds: int) -> None:
    c = contract()
    sqlite = open_store(tmp / "ledger.db", key=KEY, clock=CLOCK)
    pg = open_postgresql(url, key=KEY, clock=CLOCK)
    fns = {"sqlite": Audited(sqlite, "s_sqlite", c).call, "postgresql": Audited(pg, "s_pg", c).call}
    for fn in fns.values():
        await timed(fn, 20)  # warm up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    per_round = max(1, calls // rounds)
    ratios: list[float] = []
    for _ in range(rounds):
        got = {name: await timed(fn, per_round) for name, fn in fns.items()}
        for name, values in got.items():
            samples[name] += values
        ratios.append(statistics.median(got["postgresql"]) / statistics.median(got["sqlite"]))
    print(f"1. one worker's audited call, {per_round * rounds} calls each, {rounds} interleaved rounds:")
    for name, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1] * 1000
        print(f"  {name:<10} median {ms(values)}  p90 {p90:.2f} ms")
    ratio = statistics.median(samples["postgresql"]) / statistics.median(samples["sqlite"])
    print(f"  postgresql / sqlite: {ratio:.2f} (per round: {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    sqlite.close()
    pg.close()


_WORKER = """
import sys, time, anyio
sys.path.insert(0, {repo!r})
sys.path.insert(0, {bench!r})
import postgres as bench
from truss.ledger.stores.postgresql import open_postgresql

url, tag = sys.argv[1], sys.argv[2]
concurrent, calls, server_ms = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
store = open_postgresql(url, key=bench.KEY, clock=bench.CLOCK)
c = bench.contract()
runs = [bench.Audited(store, f"s_{{tag}}_{{n}}", c, server_ms) for n in range(concurrent)]

async def main():
    async def drive(run):
        for _ in range(calls):
            await run.call()
    await anyio.to_thread.run_sync(lambda: (print("ready", flush=True), sys.stdin.readline()))
    start = time.monotonic()
    async with anyio.create_task_group() as group:
        for run in runs:
            group.start_soon(drive, run)
    print(start, time.monotonic(), store.stats()["batches"] / max(1, store.stats()["commits"]), flush=True)

anyio.run(main)
store.close()
"""


def scaling(server_url: Callable[[], str], concurrent: int, calls: int, counts: list[int], server_ms: float) -> None:
    print(
        f"2. aggregate audited calls/s on one PostgreSQL log, {concurrent} runs per worker, {calls} calls per run,"
        f" each call answered after {server_ms:g} ms:"
    )
    code = _WORKER.format(repo=str(REPO), bench=str(REPO / "bench"))
    base: float | None = None
    for workers in counts:
        url = server_url()
        open_postgresql(url, key=KEY, clock=CLOCK).close()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, url, f"w{w}", str(concurrent), str(calls), str(server_ms)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for w in range(workers)
        ]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        spans: list[tuple[float, float, float]] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=3600)
            start, end, per_commit = (float(x) for x in out.split())
            spans.append((start, end, per_commit))
        elapsed = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
        rate = workers * concurrent * calls / elapsed
        base = base or rate
        group = statistics.median(p for _, _, p in spans)
        print(
            f"  {workers} worker(s): {rate:7.0f} calls/s  speed-up {rate / base:.2f}  ({group:.1f} appends per commit)"
        )
        sys.stdout.flush()


def _turn(i: int) -> Record:
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


def _fill(store: Any, entries: int, *, per_session: int = 100, prefix: str = "s") -> None:
    def batches() -> Any:
        made = n = 0
        while made < entries:
            count = min(per_session, entries - made)
            yield (
                f"{prefix}_{n:07d}",
                [Record("session_started", {"contract": "bench"})] + [_turn(i) for i in range(1, count)],
            )
            made += count
            n += 1

    store.bulk_append(batches(), per_txn=50)


def _seed(store: Any) -> None:
    _fill(store, 1000, per_session=10)
    store.append("s_show", [Record("session_started", {"contract": "show"})] + [_turn(i) for i in range(1, 300)])
    store.append("s_probe", [Record("session_started", {"contract": "probe"})])


def scale(tmp: Path, server_url: Callable[[], str], total: int, reps: int) -> None:
    small_url, large_url = server_url(), server_url()
    small, large = open_postgresql(small_url, key=KEY, clock=CLOCK), open_postgresql(large_url, key=KEY, clock=CLOCK)
    _seed(small)
    _seed(large)
    start = time.perf_counter()
    _fill(large, total - large.tree_size(), prefix="t")
    print(f"3. scale: bulk-filled {large.tree_size():,} entries in {time.perf_counter() - start:.0f} s", flush=True)
    home = tmp / "home"
    home.mkdir()
    write_identity_key(home / "identity.key", KEY)  # a read verifies, with the home's key by default
    counter = iter(range(10**9))

    def show(url: str) -> Callable[[], object]:
        command = [sys.executable, "-m", "truss", "--home", str(home), "--db", url, "ledger", "show", "s_show"]
        command += ["--trusted-key", KEY.verifier.vkey] if _show_takes_trusted_key() else []

        def run() -> object:
            done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"ledger show failed: {done.stderr}")
            return done

        return run

    probes: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "durable append (1 entry)": (
            lambda: small.append("s_probe", [_turn(next(counter))]),
            lambda: large.append("s_probe", [_turn(next(counter))]),
            reps * 10,
        ),
        "truss ledger show (300 entries)": (show(small_url), show(large_url), reps),
    }
    for name, (small_fn, large_fn, n) in probes.items():
        a: list[float] = []
        b: list[float] = []
        for _ in range(n):
            for fn, out in ((small_fn, a), (large_fn, b)):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        ratio = statistics.median(b) / statistics.median(a)
        print(
            f"  {name}: {ms(a)} at {small.tree_size():,} entries, {ms(b)} at {large.tree_size():,}, ratio {ratio:.2f}"
        )
        sys.stdout.flush()
    small.close()
    large.close()


def _show_takes_trusted_key() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "truss", "ledger", "show", "--help"], capture_output=True, text=True, check=False
    )
    return "--trusted-key" in done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="audited calls per variant in part 1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=4, help="runs per worker process in part 2")
    parser.add_argument("--scaling-calls", type=int, default=100, help="calls per run in part 2")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--server-ms", type=float, default=5, help="how long the tool takes to answer in part 2")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--show-reps", type=int, default=9)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--url", help="an existing server's postgresql:// URL (schemas bench_N are created in it)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="truss-bench-pg-") as d:
        tmp = Path(d)
        server: TempPostgres | None = None
        if args.url:
            counter = iter(range(1, 10**6))
            sep = "&" if "?" in args.url else "?"

            def server_url() -> str:
                return f"{args.url}{sep}schema=bench_{os.getpid()}_{next(counter)}"
        else:
            bindir = find_bindir()
            if bindir is None:
                sys.exit("PostgreSQL is not installed: `apt-get install postgresql` (or pass --url)")
            server = TempPostgres(bindir).start()
            server_url = server.new_schema
        try:
            url = server_url()
            print(f"0. baselines: {fsync_state(tmp)}; "
                  f"a bare durable one-row INSERT on the server {bare_commit_ms(url):.2f} ms", flush=True)  # fmt: skip
            anyio.run(audited_call, tmp, url, args.calls, args.rounds)
            workers = [int(n) for n in args.workers.split(",")]
            scaling(server_url, args.concurrent, args.scaling_calls, workers, args.server_ms)
            if not args.skip_scale:
                scale(tmp, server_url, args.entries, args.show_reps)
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
