"""The resume step alone: ``resume_session`` over a copy of one long suspended session, run after run.

``bench/long_run.py`` times the resume in the process that ran the session, after a run of
20-50 s whose own speed moves the ratio; this times only the resume, on a fresh copy of one
ledger each time (the same entries, payloads and fsync state every run), in a process of its own
as ``truss resume`` is. ``build`` runs ``bench/long_run.py``'s contract to its approval
(``--calls`` calls, suspended, then approved) into ``--dir`` once; ``resume`` copies that
directory ``--runs`` times and resumes each copy to its end, with the same event subscriber as
``long_run.py`` (so the run events are built as there), printing the wall and CPU time of each
resume, the medians, and the process's peak RSS.

To compare two trees, alternate ``python bench/resume_alone.py resume --dir DIR --runs 1`` from
each (the script imports the tree it lives in); the ledger built by one tree is read by both.

Usage: ``python bench/resume_alone.py build --dir DIR [--calls N]``, then
``python bench/resume_alone.py resume --dir DIR [--runs R]``; needs ``make peers``.
"""

from __future__ import annotations

import argparse
import functools
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import long_run  # noqa: E402

from truss.ledger.keys import IdentityKey  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.mcp.client import connect  # noqa: E402
from truss.runtime import Runtime  # noqa: E402
from truss.session import approve_call, pending_approvals, resume_session, run_contract  # noqa: E402

SESSION = "long"


def _runtime(directory: Path) -> Runtime:
    key = IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")
    store = open_store(directory / "ledger.db", key=key, clock=long_run.CLOCK)
    return Runtime(store=store, key=key, clock=long_run.CLOCK, home=directory, environ={},
                   connector=functools.partial(connect, verbose=False), events=[long_run.Probe(500)])  # fmt: skip


async def build(directory: Path, calls: int) -> None:
    runtime = _runtime(directory)
    try:
        first = await run_contract(runtime, long_run.contract(calls), session_id=SESSION)
        assert first.status == "suspended", first
        [waiting] = pending_approvals(list(runtime.store.read_session(SESSION)))
        approve_call(runtime, SESSION, waiting, approved=True)
    finally:
        runtime.store.close()
    print(f"built {directory}: a {calls}-call session, suspended for its last call, approved")


async def resume(directory: Path) -> tuple[float, float]:
    runtime = _runtime(directory)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        done = await resume_session(runtime, SESSION)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert done.status == "pass", done
    finally:
        runtime.store.close()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description="Time resume_session alone over copies of one long session.")
    parser.add_argument("command", choices=("build", "resume"))
    parser.add_argument("--dir", required=True, help="where the built ledger lives (copied next to it per run)")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    source = Path(options.dir)
    if options.command == "build":
        source.mkdir(parents=True, exist_ok=True)
        anyio.run(build, source, options.calls)
        return
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(options.runs):
        copy = source.with_name(source.name + ".copy")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        wall, cpu = anyio.run(resume, copy)
        shutil.rmtree(copy, ignore_errors=True)
        walls.append(wall)
        cpus.append(cpu)
        print(f"resume {wall:6.3f} s wall, {cpu:6.3f} s CPU of this process", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"median {wall:6.3f} s wall, {cpu:6.3f} s CPU; peak RSS {peak:.1f} MB")


if __name__ == "__main__":
    main()
