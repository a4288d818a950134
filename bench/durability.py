"""Durability costs: a replayed step vs a live call, and resuming a long session to its end.

1. Replayed vs live, same server, same run: ``--calls`` (default 200) calls of the counting test
   server's ``count`` tool through ``Gate.call`` (policy, budget, intent and result committed and
   signed, the stdio round trip), then the same calls again through a gate whose journal holds
   that record, as ``truss resume`` builds it: each is answered from the ledger (the recorded
   result payload read back), nothing is sent. In ``--rounds`` rounds; medians per call and the
   ratio replayed/live (the issue asks for <= 0.05).
2. Resuming a ``--steps``-call session (default 1000) to its end: ``run_contract`` drives a
   scripted plan of that many calls whose last step needs approval, so the run suspends after
   ``--steps`` live calls; after ``approve_call``, ``resume_session`` replays every recorded model
   turn and tool result and runs the one approved call live. Reported: the original run's time
   per step, the resume's time per replayed step, and their ratio.

Both commit to the same ledger, whose appends are fsync'd: the disk's fsync state measured in its
directory is printed after them (``bench/_disk.py``).

Usage: ``python bench/durability.py [--calls N] [--rounds R] [--steps N] [--db-dir DIR]``.
Results go to stdout; record them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.budget import BudgetState  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.gate import CallRequest, Gate, Journal, Redactor  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import IdentityKey  # noqa: E402
from truss.ledger.stores import LedgerStore, open_store  # noqa: E402
from truss.mcp.client import connect  # noqa: E402
from truss.runtime import Runtime  # noqa: E402
from truss.session import approve_call, pending_approvals, resume_session, run_contract  # noqa: E402

SERVER = REPO / "tests" / "durability" / "servers" / "counting.py"
CLOCK = SystemClock()


def contract(tmp: Path, steps: int = 0) -> Contract:
    plan: list[dict[str, Any]] = [{"tool": "mcp:cnt:count", "arguments": {"key": f"k{i}"}} for i in range(steps)]
    if steps:
        plan.append({"tool": "mcp:cnt:other", "arguments": {"key": "last"}})
    return Contract.model_validate(
        {
            "contract": {"name": "bench-durability", "intent": "benchmark"},
            "agent": {"steps": plan, "max_turns": steps + 5},
            "budget": {
                "max_tool_calls": 1_000_000,
                "max_model_turns": steps + 5,
                "deadline": "2h",
                "call_timeout": "30s",
            },
            "policy": {"default": "allow", "rules": [{"tool": "mcp:cnt:other", "effect": "ask"}]},
            "mcp": {
                "servers": [
                    {
                        "name": "cnt",
                        "command": sys.executable,
                        "args": [str(SERVER)],
                        "env": {"COUNT_FILE": str(tmp / "count.txt")},
                        "allow_tools": ["count", "other"],
                    }
                ]
            },
        }
    )


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000.0


async def replayed_vs_live(tmp: Path, store: LedgerStore, calls: int, rounds: int) -> None:
    c = contract(tmp)
    live_times: list[float] = []
    replay_times: list[float] = []
    async with connect(c, log_dir=tmp / "logs", clock=CLOCK) as mounts:
        for r in range(rounds):
            session = f"live-{r}"
            journal = Journal(store, session)
            await journal.append(Record("session_started", {"contract": "bench", "effective": {}}), expect_seq=0)

            def gate(j: Journal) -> Gate:
                return Gate(contract=c, journal=j, transport=mounts, tools=mounts.tools, clock=CLOCK,
                            budget=BudgetState.start(CLOCK.now_ms()), redactor=Redactor(c, {}))  # fmt: skip

            live = gate(journal)
            requests = [CallRequest(f"c{i}.0", "mcp:cnt:count", {"key": f"{r}-{i}"}, i) for i in range(calls)]
            for request in requests:
                start = time.perf_counter()
                outcome = await live.call(request)
                live_times.append(time.perf_counter() - start)
                assert outcome.outcome == "ok" and not outcome.replayed
            replay = gate(Journal(store, session, recorded=list(store.read_session(session))))
            for request in requests:
                start = time.perf_counter()
                outcome = await replay.call(request)
                replay_times.append(time.perf_counter() - start)
                assert outcome.replayed
    live_ms, replay_ms = median_ms(live_times), median_ms(replay_times)
    print(f"1. replayed step vs live call, {calls} calls x {rounds} rounds (medians per call)")
    print(f"   live call (gate, intent+result fsynced, stdio round trip)  {live_ms:8.3f} ms")
    print(f"   replayed step (answered from the ledger)                   {replay_ms:8.3f} ms")
    print(f"   ratio replayed/live                                        {replay_ms / live_ms:8.3f}x")


async def resume_long_session(tmp: Path, store: LedgerStore, key: IdentityKey, steps: int) -> None:
    c = contract(tmp, steps)
    connector = functools.partial(connect, verbose=False)
    runtime = Runtime(store=store, key=key, clock=CLOCK, home=tmp, environ={}, connector=connector)
    start = time.perf_counter()
    first = await run_contract(runtime, c, session_id=f"long-{steps}")
    original = time.perf_counter() - start
    assert first.status == "suspended", first
    session = first.session
    [waiting] = pending_approvals(list(store.read_session(session)))
    approve_call(runtime, session, waiting, approved=True)
    start = time.perf_counter()
    done = await resume_session(runtime, session)
    resumed = time.perf_counter() - start
    assert done.status == "pass", done
    per_original, per_replayed = original / steps * 1000.0, resumed / steps * 1000.0
    print(f"2. resuming a {steps}-call session to its end")
    print(f"   original run: {original:7.2f} s, {per_original:7.3f} ms per step (live call + model turn)")
    print(f"   resume:       {resumed:7.2f} s, {per_replayed:7.3f} ms per replayed step (+1 live call, verdict)")
    print(f"   ratio resume/original                                      {resumed / original:8.3f}x")


async def main(calls: int, rounds: int, steps: int, db_dir: str | None) -> None:
    with tempfile.TemporaryDirectory(dir=db_dir) as name:
        tmp = Path(name)
        key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
        store = open_store(tmp / "ledger.db", key=key, clock=CLOCK)
        try:
            await replayed_vs_live(tmp, store, calls, rounds)
            await resume_long_session(tmp, store, key, steps)
            print(f"disk: {fsync_state(tmp)}")
        finally:
            store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Durability costs: replayed vs live steps, long resumes.")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--db-dir", default=None, help="where the temporary ledger lives (default: the system tmp)")
    options = parser.parse_args()
    anyio.run(main, options.calls, options.rounds, options.steps, options.db_dir)
