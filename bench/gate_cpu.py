"""The gate's own CPU per call, in process (issue 16: target <= 0.30 ms per call).

Command: ``.venv/bin/python bench/gate_cpu.py --calls 2000 --runs 3 --db-dir /dev/shm``

``Gate.call`` in ``power`` mode over an in-process transport that answers at once with a recorded
mcp-server-time result, recording into a fresh SQLite ledger; ``time.process_time`` over
``--calls`` calls after 200 of warm-up, per run; medians. ``--stub-store`` answers ``append``
with entries written once (the gate without its two appends). ``--profile`` prints the top of a
cProfile of one run instead. Needs no server. Prints the fsync state (``bench/_disk.py``) and the
load average beside the numbers; run it from two trees alternating to compare code.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import DiskState, fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.budget import BudgetState  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.gate import CallRequest, Gate, Journal, Redactor  # noqa: E402
from truss.ledger.entry import Record, StoredEntry  # noqa: E402
from truss.ledger.keys import IdentityKey  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.tools import MountedTool, ToolResult  # noqa: E402

CLOCK = SystemClock()
TOOL, ARGS = "get_current_time", {"timezone": "UTC"}
DEFINITION = {
    "name": TOOL,
    "description": "Get current time in a specific timezones",
    "inputSchema": {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA timezone name"}},
        "required": ["timezone"],
    },
}
RESULT = {
    "content": [
        {"type": "text", "text": '{"timezone": "UTC", "datetime": "2026-12-02T05:00:00+00:00", "is_dst": false}'}
    ],
    "structuredContent": {"timezone": "UTC", "datetime": "2026-12-02T05:00:00+00:00", "is_dst": False},
    "isError": False,
}


def contract() -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "bench-gate", "intent": "benchmark"},
            "budget": {"max_tool_calls": 1_000_000, "deadline": "2h", "call_timeout": "30s"},
            "policy": {"default": "allow", "rules": [{"tool": "mcp:time:get_*", "effect": "allow"}]},
            "ledger": {"durability": "power"},
            "mcp": {"servers": [{"name": "time", "command": "mcp-server-time", "allow_tools": [TOOL]}]},
        }
    )


class Instant:
    """A transport that answers every call at once with the same result."""

    async def call(self, tool: MountedTool, arguments: Any, *, timeout_s: float, progress: Any = None) -> ToolResult:
        return ToolResult(dict(RESULT))


class Stub:
    """A store whose ``append`` answers with entries written once (the gate without its appends)."""

    def __init__(self, store: Any, session: str) -> None:
        self.store = store
        self.made: dict[str, StoredEntry] = {}
        self.session = session

    def append(self, session: str, records: Sequence[Record], **kw: Any) -> list[StoredEntry]:
        kind = records[0].kind
        if kind not in self.made:
            [self.made[kind]] = self.store.append(self.session, list(records), durable=False)
        return [self.made[kind]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def gate(store: Any, c: Contract, session: str, stub: bool) -> Gate:
    store.append(session, [Record("session_started", {"contract": c.contract.name})])
    tool = MountedTool("time", TOOL, DEFINITION, "sha256:" + "0" * 64)
    return Gate(
        contract=c,
        journal=Journal(cast(Any, Stub(store, session)) if stub else store, session, keep_entries=False),
        transport=Instant(),
        tools={tool.name: tool},
        clock=CLOCK,
        budget=BudgetState.start(CLOCK.now_ms()),
        redactor=Redactor(c, {}),
    )


async def run(g: Gate, calls: int, tag: str) -> float:
    for n in range(200):
        await g.call(CallRequest(f"w{tag}{n}", f"mcp:time:{TOOL}", ARGS, n))
    t0 = time.process_time()
    for n in range(calls):
        outcome = await g.call(CallRequest(f"c{tag}{n}", f"mcp:time:{TOOL}", ARGS, n))
        assert outcome.outcome == "ok", outcome
    return (time.process_time() - t0) / calls


async def main(calls: int, runs: int, db_dir: str | None, stub: bool, profile: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="truss-bench-gatecpu-", dir=db_dir))
    key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
    store = open_store(tmp / "ledger.db", key=key, clock=CLOCK)
    c = contract()
    state: DiskState = fsync_state(tmp)
    if profile:
        g = gate(store, c, "s_profile", stub)
        prof = cProfile.Profile()
        prof.enable()
        await run(g, calls, "p")
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(45)
        return
    cpu = [await run(gate(store, c, f"s_{i}", stub), calls, str(i)) for i in range(runs)]
    what = "gate without its appends" if stub else "Gate.call (power)"
    print(f"{what}: CPU per call {statistics.median(cpu) * 1000:.3f} ms (median of {runs}; runs "
          + ", ".join(f"{v * 1000:.3f}" for v in cpu) + f"); {calls} calls after 200 warm-up")  # fmt: skip
    print(f"  {state}; load average {os.getloadavg()[0]:.1f}; code from {REPO.name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The gate's own CPU per call, in process (issue 16)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--db-dir", default=None, help="where the ledger goes (a RAM file system: /dev/shm)")
    parser.add_argument("--stub-store", action="store_true", help="the gate without its two appends")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.runs, args.db_dir, args.stub_store, args.profile)
