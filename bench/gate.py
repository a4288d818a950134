"""The gate's cost: an audited call (policy, budget, intent and result committed and signed) vs a raw call.

Same stdio server (mcp-server-time, ``get_current_time {timezone: UTC}``), same run:

1. sequential: the raw SDK ``Client.call_tool`` vs ``Gate.call`` through ``truss.mcp.client`` in
   ``power`` durability (intent and result fsynced) and in ``process`` durability (intent
   committed without its own fsync); ``--calls`` (default 500) calls each, in ``--rounds``
   rounds, interleaved call by call in an order shuffled anew for each call (seeded), so that a
   burst of load on the machine, and the position after another kind, hit every kind alike;
   medians per call and the ratio to raw. Each server-facing kind (raw, power, process, mounts)
   has its own server process, spawned the same way (its own session, the same command and
   environment), so each server answers exactly one call per turn and none is kept warm by
   another kind's call. Two server processes answer 0.1-0.5 ms apart on a loaded machine (which
   core they run on, how they wake); that is noise no per-call interleaving removes, so compare
   runs, not one. ``split`` shows where an audited call's wall time goes: the gate before the
   send (intent committed), the server's round trip, the gate after the answer (result
   committed); and each kind's CPU time per call (this process), so that a wait would show as
   wall time without CPU;
2. where the difference goes: one durable (fsynced) single-entry append and one non-durable
   append, measured in the same rounds: an audited call in power mode pays two fsyncs, in
   process mode one, so on a disk whose fsync costs as much as a call the ratio is set by the
   disk, not by the gate; ``--db-dir /dev/shm`` (a RAM file system, where fsync is nearly free)
   shows the gate's own cost;
   ``gate-only`` = ``Gate.call`` (power) over an in-process transport that answers at once with
   the server's recorded answer: the gate's own CPU per call (policy, budget, two signed entries
   committed), without a server to wait for; ``watched`` = the same with one event subscriber
   that does nothing (``truss.events``: what the run's event stream costs a call, printing aside);
3. 16 concurrent: 16 tasks sharing one client (raw) or one gate (audited, power), throughput in
   calls/s and the ratio to raw (group commit lets concurrent intents and results share fsyncs).

The fsync state of the disk is measured in the same rounds (``bare-fsync``: an fsync of a small
append; ``bare-commit``: a synchronous SQLite WAL commit of one row, in the ledger's directory;
``bench/_disk.py``), and each audited ratio is printed beside its floor: the raw call plus the
commits its mode requires (power: two synchronous commits, the intent's and the result's;
process: one, the result's), so a slow-disk stretch shows as a high floor, not as Truss's cost.
``gate-only`` also reports the CPU time of this process per call.

Usage: ``python bench/gate.py [--calls N] [--rounds R] [--concurrent-calls N] [--db-dir DIR] [--order call|block]``;
needs ``make peers``. Results go to stdout; record them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))

from _disk import BareDisk, DiskState  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.budget import BudgetState  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.events import EventBus, RunEvents  # noqa: E402
from truss.gate import CallRequest, Gate, Journal, Redactor  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import IdentityKey  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.mcp.client import connect  # noqa: E402
from truss.tools import MountedTool, ToolResult  # noqa: E402

SERVER = REPO / ".peers" / "py" / "bin" / "mcp-server-time"
TOOL, ARGS = "get_current_time", {"timezone": "UTC"}
CLOCK = SystemClock()


def contract(durability: str) -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "bench-gate", "intent": "benchmark"},
            "budget": {"max_tool_calls": 1_000_000, "deadline": "2h", "call_timeout": "30s"},
            "policy": {"default": "allow", "rules": [{"tool": "mcp:time:get_*", "effect": "allow"}]},
            "ledger": {"durability": durability},
            "mcp": {
                "servers": [
                    {
                        "name": "time",
                        "command": str(SERVER),
                        "args": ["--local-timezone", "UTC"],
                        "allow_tools": [TOOL],
                    }
                ]
            },
        }
    )


class Audited:
    """A gate over a real mount of the server, recording into a fresh SQLite ledger."""

    def __init__(self, mounts: Any, store: Any, c: Contract, session: str, events: RunEvents | None = None) -> None:
        store.append(session, [Record("session_started", {"contract": c.contract.name})])
        self.gate = Gate(
            contract=c,
            journal=Journal(store, session),
            transport=mounts,
            tools=mounts.tools,
            clock=CLOCK,
            budget=BudgetState.start(CLOCK.now_ms()),
            redactor=Redactor(c, {}),
            events=events,
        )
        self.n = 0

    async def call(self) -> None:
        self.n += 1
        outcome = await self.gate.call(CallRequest(f"c{self.n}.0", f"mcp:time:{TOOL}", ARGS, self.n))
        assert outcome.outcome == "ok", outcome


class Split:
    """The Truss connection's ``call``, with the moments a call was sent and its answer came back."""

    def __init__(self, mounts: Any) -> None:
        self.mounts = mounts
        self.sent = self.answered = 0.0

    async def call(self, tool: MountedTool, arguments: Any, *, timeout_s: float, progress: Any = None) -> ToolResult:
        self.sent = time.perf_counter()
        result = await self.mounts.call(tool, arguments, timeout_s=timeout_s, progress=progress)
        self.answered = time.perf_counter()
        return result


class Instant:
    """A transport that answers every call at once with one recorded result (the gate's own cost)."""

    def __init__(self, result: ToolResult) -> None:
        self.result = result

    async def call(self, tool: MountedTool, arguments: Any, *, timeout_s: float, progress: Any = None) -> ToolResult:
        return ToolResult(dict(self.result.wire))


def asynchronous(fn: Any) -> Any:
    """A synchronous timed call as the coroutine function ``timed`` awaits."""

    async def call() -> None:
        fn()

    return call


async def timed(fn: Any, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return out


async def throughput(fn: Any, total: int, width: int = 16) -> float:
    per = total // width
    start = time.perf_counter()

    async def worker() -> None:
        for _ in range(per):
            await fn()

    async with anyio.create_task_group() as group:
        for _ in range(width):
            group.start_soon(worker)
    return per * width / (time.perf_counter() - start)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.3f} ms"


async def main(calls: int, rounds: int, concurrent_calls: int, db_dir: str | None, by_block: bool) -> None:
    if not SERVER.exists():
        sys.exit("mcp-server-time is not installed: run `make peers`")
    tmp = Path(tempfile.mkdtemp(prefix="truss-bench-gate-", dir=db_dir))
    key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
    store = open_store(tmp / "ledger.db", key=key, clock=CLOCK)
    errlog = open(os.devnull, "w")  # noqa: ASYNC230, SIM115 - one handle for the whole run
    params = StdioServerParameters(command=str(SERVER), args=["--local-timezone", "UTC"])
    power_c, process_c = contract("power"), contract("process")
    async with (
        Client(stdio_client(params, errlog=errlog), mode="auto", cache=None, read_timeout_seconds=30) as raw,
        connect(power_c, log_dir=tmp / "logs-power", environ={}, clock=CLOCK) as power_mounts,
        connect(process_c, log_dir=tmp / "logs-process", environ={}, clock=CLOCK) as process_mounts,
        connect(power_c, log_dir=tmp / "logs-mounts", environ={}, clock=CLOCK) as plain_mounts,
    ):

        async def raw_call() -> None:
            result = await raw.call_tool(TOOL, ARGS)
            assert not result.is_error

        power = Audited(power_mounts, store, power_c, "s_power")
        process = Audited(process_mounts, store, process_c, "s_process")
        splits = {"power": Split(power_mounts), "process": Split(process_mounts)}
        power.gate.transport, process.gate.transport = splits["power"], splits["process"]
        recorded = await power_mounts.call(power_mounts.tools[f"mcp:time:{TOOL}"], ARGS, timeout_s=30)
        instant = Audited(power_mounts, store, power_c, "s_instant")
        instant.gate.transport = Instant(recorded)
        watched_events = RunEvents(EventBus([lambda _event: None]), CLOCK, "s_watched")
        watched = Audited(power_mounts, store, power_c, "s_watched", events=watched_events)
        watched.gate.transport = Instant(recorded)
        store.append("s_fsync", [Record("session_started", {"contract": "fsync"})])
        disk = BareDisk(tmp)

        def appender(durable: bool) -> Any:
            record = Record("mcp_tool_intent", {"call": "c", "tool": "t"})

            async def append() -> None:
                await anyio.to_thread.run_sync(lambda: store.append("s_fsync", [record], durable=durable))

            return append

        fns = {
            "raw": raw_call,
            "power": power.call,
            "process": process.call,
            "mounts": lambda: plain_mounts.call(plain_mounts.tools[f"mcp:time:{TOOL}"], ARGS, timeout_s=30),
            "fsync": appender(True),
            "no-fsync": appender(False),
            "gate-only": instant.call,
            "watched": watched.call,
            "bare-fsync": asynchronous(disk.fsync),
            "bare-commit": asynchronous(disk.commit),
        }
        for fn in fns.values():  # warm up imports, caches and the WAL
            await timed(fn, 20)
        samples: dict[str, list[float]] = {name: [] for name in fns}
        cpu: dict[str, list[float]] = {name: [] for name in fns}
        # Per audited mode: the gate before the send, the server's round trip, the gate after the answer.
        phases: dict[str, list[list[float]]] = {mode: [[], [], []] for mode in splits}
        per_round = max(1, calls // rounds)
        shuffle = random.Random(16)
        turns: list[list[str]] = []  # the kinds measured in each turn, in order
        for _ in range(rounds):
            if by_block:  # each kind's calls of a round in a row (the order of earlier versions)
                turns += [[name] * per_round for name in fns]
            else:
                for _ in range(per_round):
                    order = list(fns)
                    shuffle.shuffle(order)
                    turns.append(order)
        for turn in turns:
            for name in turn:
                fn = fns[name]
                cpu_start = time.process_time()
                start = time.perf_counter()
                await fn()
                end = time.perf_counter()
                cpu[name].append(time.process_time() - cpu_start)
                samples[name].append(end - start)
                split = splits.get(name)
                if split is not None:
                    for phase, value in zip(
                        phases[name],
                        (split.sent - start, split.answered - split.sent, end - split.answered),
                        strict=True,
                    ):
                        phase.append(value)
        base = statistics.median(samples["raw"])
        state = DiskState(
            statistics.median(samples["bare-fsync"]) * 1000, statistics.median(samples["bare-commit"]) * 1000
        )
        print(
            f"sequential, {per_round * rounds} calls each, {rounds} rounds,"
            f" {'each kind in a block' if by_block else 'interleaved call by call'} (medians per call):"
        )
        print(f"  ledger in {tmp}")
        for name in fns:
            ratio = statistics.median(samples[name]) / base
            p90 = statistics.quantiles(samples[name], n=10)[-1] * 1000
            print(f"  {name:<11} {ms(samples[name])}  p90 {p90:.3f} ms  ratio {ratio:.2f}  CPU {ms(cpu[name])}")
        for mode, (before, trip, after) in phases.items():
            print(f"  split {mode:<7} gate before the send {ms(before)}, server round trip {ms(trip)},"
                  f" gate after the answer {ms(after)}")  # fmt: skip
        commit = statistics.median(samples["bare-commit"])
        print(f"  disk: {state}; load {os.getloadavg()[0]:.2f}")
        for mode, commits in (("power", 2), ("process", 1)):
            floor = base + commits * commit
            audited = statistics.median(samples[mode])
            print(f"  {mode:<8} floor (raw + {commits} commit(s)) {floor * 1000:.3f} ms = {floor / base:.2f}x raw;"
                  f" audited / floor {audited / floor:.2f}  (target <= 1.10)")  # fmt: skip
        print(f"  gate-only CPU of this process per call {ms(cpu['gate-only'])} (target <= 0.30 on a RAM file system)")

        raw_tp = await throughput(raw_call, concurrent_calls)
        audited_tp = await throughput(power.call, concurrent_calls)
        print(f"16 concurrent, {concurrent_calls} calls each:")
        print(f"  raw      {raw_tp:.0f} calls/s")
        print(f"  audited  {audited_tp:.0f} calls/s (power)  ratio {audited_tp / raw_tp:.2f}")
    disk.close()
    errlog.close()
    store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrent-calls", type=int, default=800)
    parser.add_argument("--db-dir", help="where the benchmark ledger goes (default: the system temp dir)")
    parser.add_argument(
        "--order",
        choices=("call", "block"),
        default="call",
        help="interleave the kinds call by call in a shuffled order (default), or run each kind's calls of a"
        " round in a block (a server kept warm by its previous call)",
    )
    ns = parser.parse_args()
    anyio.run(main, ns.calls, ns.rounds, ns.concurrent_calls, ns.db_dir, ns.order == "block")
