"""What confining a stdio server costs, each against the unconfined baseline measured in the same run.

Run: ``.venv/bin/python bench/sandbox.py [--rounds R] [--calls N] [--requests M] [--pairs P] [--seed S]
[--only PART ...]``
(needs ``make peers`` and a bwrap that can run here; ``--only https`` runs the HTTPS lines alone).

- start-up: spawn to tools listed of mcp-server-time through ``confined`` (network ``none``, all
  four limits) against the same command unconfined, rounds interleaved; the ratio is of the
  medians (target <= 1.15). The confined side pays the plan, the launcher, bwrap and the
  supervisor; a second line times those alone, starting ``/bin/true`` confined and plain.
- call: ``get_current_time`` on confined connections against unconfined ones (target <= 1.05):
  ``--pairs N`` servers of each kind in each of two halves (4N servers, default 12), all started
  the same way in a seeded shuffled order, each in a session of its own; then ``--calls`` calls on
  every server, each round visiting all of them in a seeded shuffled order (``--seed``). The
  ratio is of the medians of every call of each kind. Under it, the control of the same run: one
  half of a kind against the other (unconfined / unconfined, confined / confined), beside the
  confined / unconfined ratio of each half, the same shape; and the spread of each server's own
  median. One server per kind would count where the kernel happened to put that process (core,
  caches, wake-up path) as the sandbox's cost: two unconfined servers differ by several percent.
  The sandbox adds nothing to the pipe itself.
- HTTPS: an allowed HTTPS GET on a new connection each time, from a client confined with
  network ``allow`` (relay, Unix socket, egress proxy, then the loopback TLS server) against the
  same client unconfined going straight to the server (target <= 1.2), for a 26-byte body
  and, to show how the proxy's per-round-trip cost amortises, a 1 MiB one. Both clients stay
  running and alternate batches of ten requests; timed inside the client, so process start-up
  is not counted. A second line gives Truss's own cost apart from the machine's scheduling: the
  CPU time (user + system) this process, where the egress proxy runs, spends per proxied request.
  A third client, confined with network ``host`` and the same limits (no proxy: straight to the
  server from inside the sandbox), splits the ratio into the sandbox's own share and the proxy's.
- through Truss: the same start-up and call through the MCP tier's ``connect`` and
  ``SandboxLauncher`` (what ``truss run`` does: the contract's ``[mcp.servers.sandbox]``, the
  description computed before the start and checked after it, the egress reports), against the
  same contract without the table (targets as above); the calls spread over 4N servers and
  controlled as the call line's. Under it, the CPU time Truss's process spends per call on each
  side (the median of the calls: a collection lands on some call of either kind), and the same
  difference between the two unconfined halves: what only the confined call does there is the
  limit check after it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import python_peer  # noqa: E402
from tests.mcp.sandbox._tls import self_signed  # noqa: E402
from truss._clock import SystemClock  # noqa: E402
from truss.contract import Contract, load_contract_text  # noqa: E402
from truss.mcp.client import Mounts, connect  # noqa: E402
from truss.mcp.sandbox import Limits, Profile, confined, find_bwrap, parse_host_rule  # noqa: E402

CLIENT = REPO / "tests" / "mcp" / "sandbox" / "servers" / "fetch_many.py"
HTTPS_SERVER = REPO / "tests" / "mcp" / "sandbox" / "servers" / "https_server.py"
LIMITS = Limits(memory=512 * 1024 * 1024, processes=64, cpu_s=120, file_size=64 * 1024 * 1024)
ENV = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}


@asynccontextmanager
async def session(command: str, args: list[str], env: dict[str, str]) -> AsyncGenerator[ClientSession]:
    params = StdioServerParameters(command=command, args=args, env=env)
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 - opening /dev/null does not block
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            yield s


@asynccontextmanager
async def time_server(confine: bool) -> AsyncGenerator[ClientSession]:
    command, args = python_peer("mcp-server-time"), ["--local-timezone", "UTC"]
    if not confine:
        async with session(command, args, ENV) as s:
            yield s
        return
    profile = Profile(limits=LIMITS)
    async with (
        confined(profile, command, args, ENV, "/", server="time", clock=SystemClock()) as spawn,
        session(spawn.command, spawn.args, spawn.env) as s,
    ):
        yield s


async def start_once(confine: bool) -> float:
    start = time.perf_counter()
    with anyio.fail_after(60):
        async with time_server(confine) as s:
            await s.list_tools()
            elapsed = time.perf_counter() - start
    return elapsed


async def bench_start(rounds: int) -> tuple[float, float]:
    plain: list[float] = []
    boxed: list[float] = []
    await start_once(True)  # warm the page cache for both sides
    await start_once(False)
    for _ in range(rounds):
        plain.append(await start_once(False))
        boxed.append(await start_once(True))
    return statistics.median(plain), statistics.median(boxed)


async def bench_true(rounds: int) -> tuple[float, float]:
    """What the sandbox alone costs a start: ``/bin/true`` through ``confined`` vs plain, interleaved."""
    plain: list[float] = []
    boxed: list[float] = []
    profile = Profile(limits=LIMITS)
    for _ in range(rounds):
        start = time.perf_counter()
        await anyio.run_process(["/bin/true"], env=ENV)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        async with confined(profile, "/bin/true", [], ENV, "/", server="true", clock=SystemClock()) as spawn:
            await anyio.run_process([spawn.command, *spawn.args], env=spawn.env)
            boxed.append(time.perf_counter() - start)
    return statistics.median(plain), statistics.median(boxed)


Call = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Estimate:
    """The calls of one interleaved run: every call's duration (by server) and this process's CPU
    seconds during it (user + system, outside the timing), by kind (``False`` unconfined, ``True``
    confined) and half (0 or 1, the same number of servers each). The ratio pools both halves;
    the control sets one half of a kind against the other."""

    timings: dict[tuple[bool, int], list[list[float]]]
    cpu: dict[tuple[bool, int], list[float]]

    def pooled(self, confine: bool, halves: tuple[int, ...] = (0, 1)) -> float:
        return statistics.median(t for h in halves for server in self.timings[confine, h] for t in server)

    def cpu_per_call(self, confine: bool, halves: tuple[int, ...] = (0, 1)) -> float:
        """The median: a collection or another thread's turn lands on some call of either kind."""
        return statistics.median(t for h in halves for t in self.cpu[confine, h])

    def ratio(self) -> tuple[float, float]:
        return self.pooled(False), self.pooled(True)

    def control_lines(self) -> list[str]:
        n = len(self.timings[False, 0])
        aa_plain = self.pooled(False, (1,)) / self.pooled(False, (0,))
        aa_boxed = self.pooled(True, (1,)) / self.pooled(True, (0,))
        halves = [self.pooled(True, (h,)) / self.pooled(False, (h,)) for h in (0, 1)]
        spread = {
            confine: sorted(statistics.median(server) for h in (0, 1) for server in self.timings[confine, h])
            for confine in (False, True)
        }

        def span(confine: bool) -> str:
            return f"{spread[confine][0] * 1000:.3f}-{spread[confine][-1] * 1000:.3f} ms"

        return [
            f"{'':<11} control, same run ({n} vs {n} servers): unconfined / unconfined {aa_plain:.3f}x, "
            f"confined / confined {aa_boxed:.3f}x; confined / unconfined by halves {halves[0]:.3f}x, {halves[1]:.3f}x",
            f"{'':<11} each server's median: unconfined {span(False)}, confined {span(True)}",
        ]


async def interleaved(servers: dict[tuple[bool, int], list[Call]], calls: int, seed: int) -> Estimate:
    """``calls`` calls on every server, each round visiting all of them in a seeded shuffled order."""
    slots = [(key, i) for key, group in servers.items() for i in range(len(group))]
    timings = {key: [[] for _ in group] for key, group in servers.items()}
    cpu: dict[tuple[bool, int], list[float]] = {key: [] for key in servers}
    for key, i in slots:
        for _ in range(20):  # warm each: imports, first answers
            await servers[key][i]()
    order = random.Random(seed)
    for _ in range(calls):
        for key, i in order.sample(slots, len(slots)):
            call = servers[key][i]
            before = cpu_s()
            start = time.perf_counter()
            await call()
            timings[key][i].append(time.perf_counter() - start)
            cpu[key].append(cpu_s() - before)
    return Estimate(timings, cpu)


def start_order(pairs: int, seed: int) -> list[tuple[bool, int]]:
    """Which server to start next: ``pairs`` of each kind in each half, in a seeded shuffled order,
    so that neither kind is systematically started first (lower pids, earlier placement)."""
    keys = [(confine, half) for confine in (False, True) for half in (0, 1) for _ in range(pairs)]
    random.Random(seed).shuffle(keys)
    return keys


async def bench_call(calls: int, pairs: int, seed: int) -> Estimate:
    servers: dict[tuple[bool, int], list[Call]] = {(c, h): [] for c in (False, True) for h in (0, 1)}
    async with AsyncExitStack() as stack:
        for key in start_order(pairs, seed):
            s = await stack.enter_async_context(time_server(key[0]))
            servers[key].append(partial(s.call_tool, "get_current_time", {"timezone": "UTC"}))
        return await interleaved(servers, calls, seed)


class Client:
    """A running fetch_many.py: ``batch(n)`` makes n requests and returns their durations."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.pending = b""

    async def batch(self, count: int) -> list[float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        await self.process.stdin.send(f"{count}\n".encode())
        with anyio.fail_after(120):
            while b"\n" not in self.pending:
                self.pending += await self.process.stdout.receive()
        line, _, self.pending = self.pending.partition(b"\n")
        timings: list[Any] = json.loads(line)
        return [float(t) for t in timings]


@asynccontextmanager
async def client(command: str, args: list[str], env: dict[str, str]) -> AsyncGenerator[Client]:
    # In a session of its own, as Truss (and the MCP SDK) starts every stdio server, confined or
    # not: the kernel schedules each session as a group (autogroup), and a client in the
    # benchmark's own session would be compared with a confined one that bwrap's --new-session
    # puts in another, which costs a request on this kind of machine 2-3x by itself.
    process = await anyio.open_process([command, *args], env=env, stderr=None, start_new_session=True)
    async with process:
        try:
            yield Client(process)
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(30):
                await process.wait()


@asynccontextmanager
async def https_process(directory: Path, body: int) -> AsyncGenerator[tuple[int, Path]]:
    """The loopback HTTPS server in a process of its own, answering ``body`` bytes: (port, CA file)."""
    cert, key = self_signed(directory)
    command = [sys.executable, str(HTTPS_SERVER), str(cert), str(key), str(body)]
    async with await anyio.open_process(command) as process:
        try:
            assert process.stdout is not None
            with anyio.fail_after(30):
                port = int((await process.stdout.receive()).decode().split()[0])
            yield port, cert
        finally:
            process.kill()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bench_https(requests: int, body: int) -> tuple[float, float, float, float]:
    """(direct median, proxied median, the proxy's CPU seconds per proxied request, the median of
    the same client confined with network ``host``: the sandbox's own share, with no proxy)."""
    plain: list[float] = []
    boxed: list[float] = []
    hosted: list[float] = []
    cpu = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        async with https_process(Path(tmp), body) as (port, cafile):
            args = [str(CLIENT), f"https://127.0.0.1:{port}/x", str(cafile)]
            profile = Profile(
                read=(str(cafile),), network="allow", allow_hosts=(parse_host_rule(f"127.0.0.1:{port}"),), limits=LIMITS
            )
            host = Profile(read=(str(cafile),), network="host", limits=LIMITS)
            async with (
                confined(profile, sys.executable, args, ENV, "/", server="fetch") as spawn,
                confined(host, sys.executable, args, ENV, "/", server="fetch-host") as spawn_host,
                client(spawn.command, spawn.args, spawn.env) as inside,
                client(spawn_host.command, spawn_host.args, spawn_host.env) as inside_host,
                client(sys.executable, args, ENV) as outside,
            ):
                await inside.batch(10)  # warm all three: imports, first handshakes
                await inside_host.batch(10)
                await outside.batch(10)
                # Small batches, interleaved: all sides see the same load on a shared machine.
                for _ in range(max(1, requests // 10)):
                    plain += await outside.batch(10)
                    before = cpu_s()
                    boxed += await inside.batch(10)
                    cpu += cpu_s() - before
                    hosted += await inside_host.batch(10)
    med = statistics.median
    return med(plain), med(boxed), cpu / len(boxed), med(hosted)


def time_contract(confine: bool) -> Contract:
    table = '[mcp.servers.sandbox]\nlimits = { memory = "512M", processes = 64, cpu = "120s", file_size = "64M" }\n'
    text = f"""
[contract]
name = "bench"
intent = "time through the MCP tier"
[[mcp.servers]]
name = "time"
command = {json.dumps(python_peer("mcp-server-time"))}
args = ["--local-timezone", "UTC"]
allow_tools = ["get_current_time"]
{table if confine else ""}
"""
    return load_contract_text(text, source="bench.toml")


@asynccontextmanager
async def mounted(confine: bool, logs: Path) -> AsyncGenerator[Mounts]:
    async with connect(time_contract(confine), log_dir=logs, clock=SystemClock(), environ=ENV) as mounts:
        yield mounts


async def bench_connect(rounds: int, calls: int, pairs: int, seed: int) -> tuple[tuple[float, float], Estimate]:
    """Start-up (connect to tools mounted) medians through ``connect``, (plain, confined), and the
    calls through it, interleaved across ``pairs`` servers of each kind in each half as ``bench_call``."""
    starts: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        for confine in (True, False):  # warm both
            async with mounted(confine, logs):
                pass
        for _ in range(rounds):
            for confine in (False, True):
                start = time.perf_counter()
                with anyio.fail_after(60):
                    async with mounted(confine, logs):
                        starts[confine].append(time.perf_counter() - start)
        servers: dict[tuple[bool, int], list[Call]] = {(c, h): [] for c in (False, True) for h in (0, 1)}
        async with AsyncExitStack() as stack:
            for key in start_order(pairs, seed):
                m = await stack.enter_async_context(mounted(key[0], logs))
                tool = m.tools["mcp:time:get_current_time"]
                servers[key].append(partial(m.call, tool, {"timezone": "UTC"}, timeout_s=30))
            estimate = await interleaved(servers, calls, seed)
    med = statistics.median
    return (med(starts[False]), med(starts[True])), estimate


PARTS = ("start", "call", "https", "truss")


def line(name: str, base: float, measured: float, target: float) -> str:
    ratio = measured / base
    verdict = "ok" if ratio <= target else "OVER TARGET"
    times = f"unconfined {base * 1000:8.2f} ms   confined {measured * 1000:8.2f} ms"
    return f"{name:<11} {times}   {ratio:5.2f}x (target <= {target}x) {verdict}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--pairs", type=int, default=3, help="servers of each kind in each half of the call lines (default 3)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the call lines' orders (default 0)")
    parser.add_argument(
        "--only", action="append", choices=PARTS, help="run only these parts (repeatable; default: all)"
    )
    options = parser.parse_args()
    parts = set(options.only or PARTS)
    bwrap = await find_bwrap()
    sizes = (
        f"rounds {options.rounds}, calls {options.calls}, requests {options.requests}, "
        f"pairs {options.pairs}, seed {options.seed}"
    )
    print(f"bwrap {bwrap.version} ({bwrap.source}); {sizes}")
    if "start" in parts:
        print(line("start-up", *await bench_start(options.rounds), 1.15))
        plain, boxed = await bench_true(options.rounds * 2)
        print(f"{'':<11} the sandbox alone (/bin/true): plain {plain * 1000:.1f} ms, confined {boxed * 1000:.1f} ms")
    if "call" in parts:
        estimate = await bench_call(options.calls, options.pairs, options.seed)
        print(line("call", *estimate.ratio(), 1.05))
        print("\n".join(estimate.control_lines()))
    https = (("https", options.requests, 26), ("https 1M", max(10, options.requests // 4), 1 << 20))
    for name, count, body in https if "https" in parts else ():
        direct, proxied, cpu, hosted = await bench_https(count, body)
        print(line(name, direct, proxied, 1.2))
        print(
            f"{'':<11} the sandbox without the proxy (network host, same limits): {hosted * 1000:.2f} ms, "
            f"{hosted / direct:.2f}x direct; through the proxy vs it: {proxied / hosted:.2f}x"
        )
        print(f"{'':<11} the egress proxy's CPU time per request: {cpu * 1e6:8.0f} us (user + system, Truss's process)")
    if "truss" in parts:
        start, estimate = await bench_connect(options.rounds, options.calls, options.pairs, options.seed)
        print(line("truss start", *start, 1.15))
        print(line("truss call", *estimate.ratio(), 1.05))
        print("\n".join(estimate.control_lines()))
        plain_cpu, boxed_cpu = estimate.cpu_per_call(False), estimate.cpu_per_call(True)
        control = estimate.cpu_per_call(False, (1,)) - estimate.cpu_per_call(False, (0,))
        print(
            f"{'':<11} Truss's CPU time per call (user + system, this process; medians): "
            f"unconfined {plain_cpu * 1e6:.0f} us, "
            f"confined {boxed_cpu * 1e6:.0f} us (difference {(boxed_cpu - plain_cpu) * 1e6:+.0f} us; "
            f"unconfined / unconfined {control * 1e6:+.0f} us)"
        )


if __name__ == "__main__":
    anyio.run(main)
