"""The resume step alone: ``resume_session`` over a copy of one long suspended session, run after run.

``bench/long_run.py`` times the resume in the process that ran the session, after a run of
20-50 s whose own speed moves the ratio; this times only the resume, on a fresh copy of one
ledger each time (the same entries, payloads and fsync state every run), in a process of its own
as ``truss resume`` is. ``build`` runs ``bench/long_run.py``'s contract to its approval
(``--calls`` calls, suspended, then approved) into ``--dir`` once; ``resume`` copies that
directory ``--runs`` times and resumes each copy to its end, with the same event subscriber as
``long_run.py`` (so the run events are built as there), printing the wall and CPU time of each
resume, the medians, and the process's peak RSS.

``resume --cli`` times what a user runs instead: ``truss --home COPY resume long`` as a process of
its own on each copy (the home holding the ledger and the bench's identity key), from its start
to its exit, so whatever the command does around ``resume_session`` is in the time; the CPU is
that process's and its children's (the signature helper, the server), its output is discarded,
and it must exit 0. Both modes print the disk's fsync state (``bench/_disk.py``) and the load
average before the first run and after the last.

To compare two trees, alternate ``python bench/resume_alone.py resume --dir DIR --runs 1`` (or
with ``--cli``) from each (the script imports, and ``--cli`` runs, the tree it lives in); the
ledger built by one tree is read by both.

Usage: ``python bench/resume_alone.py build --dir DIR [--calls N]``, then
``python bench/resume_alone.py resume --dir DIR [--runs R] [--cli]``; needs ``make peers``.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import long_run  # noqa: E402
from _disk import fsync_state  # noqa: E402

from truss.ledger.keys import IdentityKey, write_identity_key  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.mcp.client import connect  # noqa: E402
from truss.runtime import Runtime  # noqa: E402
from truss.session import approve_call, pending_approvals, resume_session, run_contract  # noqa: E402

SESSION = "long"


def _key() -> IdentityKey:
    return IdentityKey.from_seed(bytes(range(32)), "bench.truss.test")


def _runtime(directory: Path) -> Runtime:
    key = _key()
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


def resume_cli(home: Path, imports: Path) -> tuple[float, float]:
    """``truss --home HOME resume long`` as a process of this tree: its wall and its CPU (with
    the children it waited for)."""
    home.chmod(0o700)
    if not (home / "identity.key").exists():
        write_identity_key(home / "identity.key", _key())
    env = {**os.environ, "PYTHONPATH": str(imports)}
    env.pop("TRUSS_FAULT", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "truss", "--home", str(home), "resume", SESSION],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=home,
        timeout=600,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr[-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _this_tree(directory: Path) -> Path:
    """A directory that makes ``truss`` and ``truss_cli`` (``cli/``) import from this tree, whatever
    an installed copy maps them to."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, target in (("truss", REPO / "truss"), ("truss_cli", REPO / "cli")):
        link = directory / name
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description="Time resume_session alone over copies of one long session.")
    parser.add_argument("command", choices=("build", "resume"))
    parser.add_argument("--dir", required=True, help="where the built ledger lives (copied next to it per run)")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cli", action="store_true", help="time `truss resume` as a process instead")
    options = parser.parse_args()
    source = Path(options.dir)
    if options.command == "build":
        source.mkdir(parents=True, exist_ok=True)
        anyio.run(build, source, options.calls)
        return
    walls: list[float] = []
    cpus: list[float] = []
    whose = "of `truss resume` and its children" if options.cli else "of this process"
    print(f"disk before: {fsync_state(source.parent)}; load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="resume-alone-") as scratch:
        imports = _this_tree(Path(scratch))
        for _ in range(options.runs):
            copy = source.with_name(source.name + ".copy")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(source, copy)
            wall, cpu = resume_cli(copy, imports) if options.cli else anyio.run(resume, copy)
            shutil.rmtree(copy, ignore_errors=True)
            walls.append(wall)
            cpus.append(cpu)
            print(f"resume {wall:6.3f} s wall, {cpu:6.3f} s CPU {whose}", flush=True)
    usage = resource.RUSAGE_CHILDREN if options.cli else resource.RUSAGE_SELF
    peak = resource.getrusage(usage).ru_maxrss / 1000
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"median {wall:6.3f} s wall, {cpu:6.3f} s CPU; peak RSS {peak:.1f} MB", flush=True)
    print(f"disk after:  {fsync_state(source.parent)}; load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
