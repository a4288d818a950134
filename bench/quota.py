"""Quotas and native Tasks: what a quota check costs a run start, and a delegated run through a task.

Two comparisons, each against a baseline measured in the same run, rounds alternating the order:

1. **Quota check at run start.** ``truss run contracts/hello.toml`` (against mcp-server-time) in a
   home without quotas vs in a home whose operator config has two quotas that apply to it (a
   per-contract and a per-principal one): the second pays the reservation (one checked append to
   ``@quota``, fsynced) before the run and the settlement after it. Target <= 1.05x. Also printed:
   the reservation and settlement themselves, in process, on a ledger whose ``@quota`` already
   holds ``--history`` earlier runs (the fold is incremental, so this stays flat), with the
   cost of one durable append measured on the same disk and its fsync state (``bench/_disk.py``).
2. **A delegated run through a task.** On one running ``serve-mcp`` (stdio), the synchronous
   ``truss_run_contract {contract: "hello"}`` vs the same call in task mode (the 2026-07-28 Tasks
   extension: the task id at once, then ``tasks/get`` at the server's ``pollIntervalMs`` until
   ``completed``). Target <= 1.1x.

    .venv/bin/python bench/quota.py [--rounds 7] [--history 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, types
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from pydantic import Field

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = REPO / "contracts"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402
from serve import _call, _init, _params, truss_run  # noqa: E402  (the same runs and calls as bench/serve.py)

QUOTAS = """
[[harness.quotas]]
name = "bench-contract"
window = "24h"
runs = 1000000
tool_calls = 100000000

[[harness.quotas]]
name = "bench-principal"
window = "1h"
per = "principal"
runs = 1000000
"""


def in_process(work: Path, history: int, rounds: int) -> tuple[float, float, float]:
    """Median ms of one reservation, one settlement, and one durable append, on a ledger with history."""
    from truss._clock import SystemClock
    from truss._quota_book import reserve, settle
    from truss.contract import load_contract_text
    from truss.ledger.entry import Record
    from truss.ledger.keys import IdentityKey
    from truss.ledger.stores import open_store

    key = IdentityKey.create(work / "inproc.key")
    clock = SystemClock()
    store = open_store(str(work / "inproc.db"), key=key, clock=clock, create=True)
    text = (REPO / "contracts" / "hello.toml").read_text(encoding="utf-8") + QUOTAS.replace("harness.quotas", "quotas")
    contract = load_contract_text(text, source="hello.toml")
    try:
        for n in range(history):
            reserve(store, contract, session=f"s_hist{n}", principal=None, now_ms=clock.now_ms())
            store.append(f"s_hist{n}", [Record("session_started", {"contract": "hello"})], durable=False)
            store.append(f"s_hist{n}", [Record("session_ended", {"status": "pass"})], durable=False)
            settle(store, f"s_hist{n}", now_ms=clock.now_ms())
        reserving: list[float] = []
        settling: list[float] = []
        appending: list[float] = []
        for n in range(rounds * 5):
            session = f"s_bench{n}"
            t0 = time.perf_counter()
            reserve(store, contract, session=session, principal=None, now_ms=clock.now_ms())
            t1 = time.perf_counter()
            store.append(session, [Record("session_started", {"contract": "hello"})])
            t2 = time.perf_counter()
            store.append(session, [Record("session_ended", {"status": "pass"})])
            t3 = time.perf_counter()
            settle(store, session, now_ms=clock.now_ms())
            t4 = time.perf_counter()
            reserving.append(t1 - t0)
            appending.extend((t2 - t1, t3 - t2))
            settling.append(t4 - t3)
        return (statistics.median(reserving) * 1000, statistics.median(settling) * 1000,
                statistics.median(appending) * 1000)  # fmt: skip
    finally:
        store.close()


# -- the task-mode client (as tests/serve/test_serve_tasks.py) -------------------------------------


class TaskHandle(types.Result):
    result_type: Literal["task"] = "task"
    task_id: str
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"


class TaskState(types.Result):
    status: str
    result: dict[str, Any] | None = None
    poll_interval_ms: int | None = None


async def _resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    wait_s = (handle.poll_interval_ms or 100) / 1000
    while True:
        await anyio.sleep(wait_s)  # honour the server's pollIntervalMs, as a well-behaved client does
        state = await ctx.session.send_request(GetTask(params=TaskIdParams(taskId=handle.task_id)), TaskState)
        if state.status == "completed" and state.result is not None:
            return types.CallToolResult.model_validate(state.result)
        wait_s = (state.poll_interval_ms or 100) / 1000


class Tasks(ClientExtension):
    identifier = "io.modelcontextprotocol/tasks"

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=_resolve)]


async def delegated(work: Path, rounds: int) -> tuple[float, float]:
    home = work / "serve-home"
    _init(home)
    sync: list[float] = []
    task: list[float] = []
    params = _params(home, CONTRACTS)
    with (work / "serve.stderr.log").open("a") as log:
        async with (
            Client(stdio_client(params, errlog=log), read_timeout_seconds=300) as plain,  # pyright: ignore[reportArgumentType]
            Client(stdio_client(params, errlog=log), read_timeout_seconds=300, extensions=[Tasks()]) as tasks,  # pyright: ignore[reportArgumentType]
        ):
            await _call(plain)
            await _call(tasks)  # warm-up both
            for i in range(rounds):
                order = (plain, tasks) if i % 2 == 0 else (tasks, plain)
                for client in order:
                    (sync if client is plain else task).append(await _call(client))
                print(f"round {i + 1}: sync {sync[-1] * 1000:.0f} ms, task {task[-1] * 1000:.0f} ms", flush=True)
    return statistics.median(sync), statistics.median(task)


async def main_async(rounds: int, history: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="truss-bench-quota-"))
    try:
        plain, quota = work / "plain", work / "quota"
        _init(plain)
        _init(quota)
        (quota / "config.toml").write_text(QUOTAS, encoding="utf-8")
        truss_run(plain, CONTRACTS)
        truss_run(quota, CONTRACTS)  # warm-up
        base: list[float] = []
        with_quota: list[float] = []
        for i in range(rounds):
            for home in (plain, quota) if i % 2 == 0 else (quota, plain):
                elapsed = await anyio.to_thread.run_sync(truss_run, home, CONTRACTS)
                (base if home is plain else with_quota).append(elapsed)
            print(f"round {i + 1}: run {base[-1] * 1000:.0f} ms, run with quotas {with_quota[-1] * 1000:.0f} ms",
                  flush=True)  # fmt: skip
        disk = fsync_state(work)
        reserve_ms, settle_ms, append_ms = in_process(work, history, rounds)
        sync, task = await delegated(work, rounds)
        b, q = statistics.median(base), statistics.median(with_quota)
        print(f"\nmedians over {rounds} rounds (load average {os.getloadavg()[0]:.1f}):")
        print(f"  truss run contracts/hello.toml, no quotas (baseline)   {b * 1000:8.0f} ms")
        print(f"  the same with two operator quotas                      {q * 1000:8.0f} ms   ratio {q / b:.3f}")
        print(f"  in process, @quota holding {history} earlier runs: reserve {reserve_ms:.2f} ms, "
              f"settle {settle_ms:.2f} ms (one durable append: {append_ms:.2f} ms)")  # fmt: skip
        print(f"  disk: {disk}")
        print(f"  truss_run_contract, synchronous (baseline)             {sync * 1000:8.0f} ms")
        print(
            f"  truss_run_contract as a task, polled                   {task * 1000:8.0f} ms   ratio {task / sync:.3f}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--history", type=int, default=1000)
    args = parser.parse_args()
    anyio.run(main_async, args.rounds, args.history)


if __name__ == "__main__":
    main()
