"""A long scripted run: does call 5,000 cost what call 5 did, and does memory stay flat?

One process drives ``run_contract`` over a scripted plan of ``--calls`` (default 5,000) calls of
mcp-server-time's ``get_current_time`` (one model turn each), the last of which needs approval, so
the run suspends after ``--calls`` live calls; then ``approve_call`` and ``resume_session``
replay every recorded turn and result and run the approved call live. Measured in the same run:

1. the cost per call of each block of ``--block`` (default 500) calls, from the run's own
   ``CallEnded`` events (wall time between the first and the last call of the block, divided by
   the calls in it); the ratio last block / first block (target <= 1.1);
2. resident memory (``/proc/self/statm``) after the first block and at the run's end, and the
   ratio (target <= 1.1);
3. the resume of the whole session vs the original run (target <= 0.1), in wall time and in the
   CPU time of this process (steadier than wall time on a loaded machine);
4. the fsync state the run was measured in (``bench/_disk.py``: a bare fsync and a bare
   synchronous SQLite commit next to the ledger, medians, before and after);
5. this machine's own speed in each block: a fixed reference workload (Python, JSON, SHA-256,
   an in-memory SQLite insert; about 5 ms of CPU) run after every 50th call, between two calls'
   timestamps, so outside the per-call costs; a block's speed is the median of its samples. On a
   shared VM the CPU time of the same work moves by up to two times in stretches of seconds; the
   reference shows such a stretch, and 1. divided by the reference's ratio is a rough correction
   for it (a sample every 50 calls follows the machine only roughly: read the target from 1.,
   over several runs).

Usage: ``python bench/long_run.py [--calls N] [--block N] [--db-dir DIR]``; needs ``make peers``.
Record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import resource
import sqlite3
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
from truss.contract import Contract  # noqa: E402
from truss.events import CallEnded, Event  # noqa: E402
from truss.ledger.keys import IdentityKey  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.mcp.client import connect  # noqa: E402
from truss.runtime import Runtime  # noqa: E402
from truss.session import approve_call, pending_approvals, resume_session, run_contract  # noqa: E402

CLOCK = SystemClock()
TIME_SERVER = REPO / ".peers" / "py" / "bin" / "mcp-server-time"
PAGE = os.sysconf("SC_PAGE_SIZE")
_SAMPLE_EVERY = 50  # calls between two samples of the machine's speed


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE / 1e6


def contract(calls: int) -> Contract:
    plan: list[dict[str, Any]] = [
        {"tool": "mcp:time:get_current_time", "arguments": {"timezone": "UTC"}} for _ in range(calls)
    ]
    plan.append({"tool": "mcp:time:convert_time", "arguments": {"source_timezone": "UTC", "time": "12:00",
                                                                "target_timezone": "Asia/Tokyo"}})  # fmt: skip
    return Contract.model_validate(
        {
            "contract": {"name": "bench-long-run", "intent": "benchmark"},
            "agent": {"steps": plan, "max_turns": calls + 5},
            "budget": {"max_tool_calls": calls + 5, "max_model_turns": calls + 5, "deadline": "2h"},
            "policy": {"default": "allow", "rules": [{"tool": "mcp:time:convert_time", "effect": "ask"}]},
            "mcp": {
                "servers": [
                    {
                        "name": "time",
                        "command": str(TIME_SERVER),
                        "args": ["--local-timezone", "UTC"],
                        "allow_tools": ["get_current_time", "convert_time"],
                    }
                ]
            },
        }
    )


def reference_ms() -> float:
    """CPU time of a fixed workload shaped like a call's."""
    doc = {"content": [{"type": "text", "text": "2026-12-02T00:00:00+00:00"}], "n": list(range(40))}
    start = time.process_time()
    if True:
        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        for i in range(400):
            raw = json.dumps(doc, sort_keys=True).encode()
            json.loads(raw)
            db.execute("INSERT INTO t VALUES (?, ?)", (i, hashlib.sha256(raw).digest()))
        db.commit()
        db.close()
    return (time.process_time() - start) * 1000.0


class Probe:
    """Times and memory at each block boundary, from the run's own call events."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.samples: list[tuple[int, float]] = []  # (calls so far, the reference's CPU ms): item 5
        self.skew_wall = self.skew_cpu = 0.0
        self.rss_after_first: float | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, CallEnded) and not event.replayed and event.outcome == "ok":
            # Timestamps less the reference workload's time so far: it never counts as a call's.
            self.times.append(time.perf_counter() - self.skew_wall)
            self.cpu.append(time.process_time() - self.skew_cpu)
            if len(self.times) == self.block:
                self.rss_after_first = rss_mb()
            if len(self.times) % _SAMPLE_EVERY == 0:
                wall, cpu = time.perf_counter(), time.process_time()
                self.samples.append((len(self.times), reference_ms()))
                self.skew_wall += time.perf_counter() - wall
                self.skew_cpu += time.process_time() - cpu

    def reference_per_block(self) -> list[float]:
        """The median of each block's reference samples (ms of CPU)."""
        out: list[float] = []
        for start in range(0, len(self.times) - self.block + 1, self.block):
            inside = [ms for at, ms in self.samples if start < at <= start + self.block]
            out.append(statistics.median(inside))
        return out

    def per_call_ms(self, cpu: bool = False) -> list[float]:
        out: list[float] = []
        series = self.cpu if cpu else self.times
        for start in range(0, len(series) - self.block + 1, self.block):
            chunk = series[start : start + self.block]
            out.append((chunk[-1] - chunk[0]) / (len(chunk) - 1) * 1000.0)
        return out


async def main(calls: int, block: int, db_dir: str | None) -> None:
    with tempfile.TemporaryDirectory(dir=db_dir) as name:
        tmp = Path(name)
        before = fsync_state(tmp)
        key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
        store = open_store(tmp / "ledger.db", key=key, clock=CLOCK)
        probe = Probe(block)
        connector = functools.partial(connect, verbose=False)
        runtime = Runtime(store=store, key=key, clock=CLOCK, home=tmp, environ={}, connector=connector, events=[probe])
        c = contract(calls)
        try:
            start, cpu_start = time.perf_counter(), time.process_time()
            first = await run_contract(runtime, c, session_id="long")
            original, original_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            rss_end = rss_mb()
            assert first.status == "suspended", first
            [waiting] = pending_approvals(list(store.read_session(first.session)))
            approve_call(runtime, first.session, waiting, approved=True)
            start, cpu_start = time.perf_counter(), time.process_time()
            done = await resume_session(runtime, first.session)
            resumed, resumed_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            assert done.status == "pass", done
        finally:
            store.close()
        after = fsync_state(tmp)
    blocks, cpu = probe.per_call_ms(), probe.per_call_ms(cpu=True)
    print(f"a {calls}-call scripted run against mcp-server-time (power mode, one model turn per call)")
    print(f"   fsync state before: {before}")
    print(f"   per call, each block of {block}: " + ", ".join(f"{ms:.2f}" for ms in blocks) + " ms")
    print("   CPU of this process per call, each block: " + ", ".join(f"{ms:.2f}" for ms in cpu) + " ms")
    print(f"1. last block / first block                          {blocks[-1] / blocks[0]:8.3f}x  (target <= 1.1)")
    print(f"   the same in CPU time of this process              {cpu[-1] / cpu[0]:8.3f}x")
    ref = probe.reference_per_block()
    print("   the machine's reference workload, each block: " + ", ".join(f"{ms:.2f}" for ms in ref) + " ms CPU")
    print(f"   reference last / first                            {ref[-1] / ref[0]:8.3f}x")
    print(f"   last / first block, for the machine's speed       {blocks[-1] / blocks[0] / (ref[-1] / ref[0]):8.3f}x"
          f" (CPU {cpu[-1] / cpu[0] / (ref[-1] / ref[0]):.3f}x)")  # fmt: skip
    assert probe.rss_after_first is not None
    print(f"2. RSS after {block} calls {probe.rss_after_first:7.1f} MB, at the end {rss_end:7.1f} MB "
          f"(peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000:.1f} MB)")  # fmt: skip
    print(f"   RSS end / after {block}                                {rss_end / probe.rss_after_first:8.3f}x"
          "  (target <= 1.1)")  # fmt: skip
    print(f"3. original run {original:7.2f} s, resume of all {calls} calls {resumed:7.2f} s")
    print(f"   resume / original                                 {resumed / original:8.3f}x  (target <= 0.1)")
    print(f"   CPU of this process: run {original_cpu:7.2f} s, resume {resumed_cpu:7.2f} s "
          f"({resumed_cpu / original_cpu:.3f}x; the servers' own CPU not counted)")  # fmt: skip
    print(f"   fsync state after:  {after}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A long scripted run: flat per-call cost and memory, and its resume.")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--db-dir", default=None, help="where the temporary ledger lives (default: the system tmp)")
    options = parser.parse_args()
    anyio.run(main, options.calls, options.block, options.db_dir)
