"""Witnessing benchmarks: submitting a checkpoint to two local witnesses vs signing it, and what a
run pays for witnessing, at its end and per tool call. Baselines are measured in the same run.

Two real ``truss witness serve`` processes listen on 127.0.0.1 for the whole run.

1. In process, on a SQLite ledger: ``sign_checkpoint`` (what every session end already does:
   consistency check, Ed25519 signature, a durable checkpoint row) vs ``witness_checkpoint`` of
   that checkpoint to both witnesses (two HTTP round trips at once, each witness's fsync'd
   check-and-persist, merging the cosignatures into the stored note, one durable batch of two
   ``checkpoint_witnessed`` entries). Medians over ``--runs``; the disk's fsync state measured in the
   same directory (``bench/_disk.py``) is printed beside them.
2. ``truss run`` of a contract making ``--calls`` echo calls to a stdio server, in a home with
   and without ``witness.toml`` (interleaved, ``--runs`` each). From the entries' own timestamps:
   the loop's time per tool call (first call to last result, over the calls) and the session end
   (``session_ended`` to the last ``checkpoint_witnessed`` entry of that run); and the process's
   wall time.

Usage: ``python bench/witness.py [--runs N] [--calls N]``. Record the numbers in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import anyio  # noqa: E402
from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.ledger.entry import Record  # noqa: E402
from truss.ledger.keys import CosignerKey, IdentityKey  # noqa: E402
from truss.ledger.note import sign_checkpoint  # noqa: E402
from truss.ledger.stores import open_store  # noqa: E402
from truss.ledger.tlog_policy import parse_policy  # noqa: E402
from truss.witness.config import WitnessSettings  # noqa: E402
from truss.witness.submit import WitnessReport, witness_checkpoint  # noqa: E402

PY = sys.executable
CLOCK = SystemClock()
TOOLS = REPO / "tests" / "e2e" / "servers" / "tools.py"
ORIGIN = "bench.truss.test/witnessed"


def start_witness(directory: Path, name: str, log_vkeys: list[str]) -> tuple[subprocess.Popen[str], str, CosignerKey]:
    subprocess.run([PY, "-m", "truss", "witness", "init", "--dir", str(directory), "--name", name],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    logs = "".join(f'[[log]]\nkeys = ["{vkey}"]\n' for vkey in log_vkeys)
    (directory / "config.toml").write_text("max_per_minute = 100000\n" + logs)
    proc = subprocess.Popen([PY, "-m", "truss", "witness", "serve", "--dir", str(directory)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: lines.put(out.readline()), daemon=True).start()
    line = lines.get(timeout=60)
    if not line.startswith("listening on "):
        sys.exit(f"witness {name} did not start")
    return proc, line.split()[-1], CosignerKey.load(directory / "witness.key")


def in_process(tmp: Path, key: IdentityKey, policy_text: str, runs: int) -> None:
    settings = WitnessSettings(parse_policy(policy_text), 0, 10.0, 0, True, "bench")
    store = open_store(tmp / "inproc.db", key=key, clock=CLOCK)
    sign_ms: list[float] = []
    witness_ms: list[float] = []
    for i in range(runs + 1):
        store.append(
            f"s_{i}", [Record("session_started", {"contract": "bench"}), Record("session_ended", {"status": "pass"})]
        )
        t = time.perf_counter()
        checkpoint = sign_checkpoint(store, key)
        signed = (time.perf_counter() - t) * 1000
        assert checkpoint.note is not None
        note = checkpoint.note

        async def submit(note: bytes = note) -> WitnessReport:
            return await witness_checkpoint(store, note, settings, CLOCK, throttle=False)

        t = time.perf_counter()
        report = anyio.run(submit)
        witnessed = (time.perf_counter() - t) * 1000
        if not report.witnessed:
            sys.exit(f"not witnessed: {report.summary()}")
        if i:  # the first round warms connections and caches
            sign_ms.append(signed)
            witness_ms.append(witnessed)
    store.close()
    s, w = statistics.median(sign_ms), statistics.median(witness_ms)
    print(f"1. sign a checkpoint (baseline)          median {s:7.2f} ms  (runs {runs})")
    print(f"   submit it to two local witnesses      median {w:7.2f} ms  ratio {w / s:5.1f}x the signing")
    print(f"   disk: {fsync_state(tmp)}")


CONTRACT = """
[contract]
name = "bench-witness"
intent = "echo"
[agent]
max_turns = {turns}
{steps}
[budget]
max_tool_calls = {turns}
max_model_turns = {turns}
[[mcp.servers]]
name = "tools"
command = {python}
args = [{tools}]
allow_tools = ["echo"]
connect_timeout = "20s"
"""


def run_once(home: Path, contract: Path) -> tuple[float, str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    t = time.perf_counter()
    done = subprocess.run([PY, "-m", "truss", "run", str(contract), "--json"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    wall = time.perf_counter() - t
    if done.returncode not in (0, 1):
        sys.exit(f"truss run failed:\n{done.stdout}\n{done.stderr}")
    return wall, json.loads(done.stdout)["session"]


def phases(db: Path, session: str, calls: int) -> tuple[float, float]:
    """(ms per tool call in the loop, ms from session_ended to the run's last witness entry)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT kind, ts, idx FROM entries WHERE session = ? ORDER BY seq", (session,)).fetchall()
        ended_ts, ended_idx = next((t, i) for k, t, i in rows if k == "session_ended")
        after = conn.execute(
            "SELECT MAX(ts) FROM entries WHERE session = '@log' AND kind = 'checkpoint_witnessed' AND idx > ?",
            (ended_idx,),
        ).fetchone()
    intents = [t for k, t, _ in rows if k == "mcp_tool_intent"]
    results = [t for k, t, _ in rows if k == "mcp_tool_call"]
    per_call = (results[-1] - intents[0]) / max(1, calls - 1) if calls > 1 else 0.0
    end = (after[0] - ended_ts) if after and after[0] is not None else 0.0
    return per_call, float(end)


def by_process(tmp: Path, key_text: str, policy_text: str, runs: int, calls: int) -> None:
    steps = "\n".join('[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "hi" }' for _ in range(calls))
    contract = tmp / "bench.toml"
    contract.write_text(CONTRACT.format(steps=steps, calls=calls, turns=calls * 2 + 5, python=json.dumps(PY),
                                        tools=json.dumps(str(TOOLS))))  # fmt: skip
    homes: dict[str, Path] = {}
    for label in ("plain", "witnessed"):
        home = tmp / label
        home.mkdir(mode=0o700)
        fd = os.open(home / "identity.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key_text)
        homes[label] = home
    (homes["witnessed"] / "witnesses.policy").write_text(policy_text)
    (homes["witnessed"] / "witness.toml").write_text('policy = "witnesses.policy"\nmin_interval = "1ms"\n')
    results: dict[str, list[tuple[float, float, float]]] = {"plain": [], "witnessed": []}
    for i in range(runs + 1):
        for label, home in homes.items():
            wall, session = run_once(home, contract)
            per_call, end = phases(home / "ledger.db", session, calls)
            if i:
                results[label].append((wall * 1000, per_call, end))
    med = {label: [statistics.median(r[j] for r in rows) for j in range(3)] for label, rows in results.items()}
    p, w = med["plain"], med["witnessed"]
    print(f"2. truss run, {calls} tool calls, {runs} runs each (medians)")
    print(f"   per tool call in the loop   without {p[1]:6.2f} ms   with witnesses {w[1]:6.2f} ms   "
          f"ratio {w[1] / p[1] if p[1] else float('nan'):4.2f}")  # fmt: skip
    print(f"   session end: witnessing      {w[2]:6.1f} ms (session_ended to the last witness entry)")
    print(f"   whole process                without {p[0]:6.0f} ms   with witnesses {w[0]:6.0f} ms   "
          f"difference {w[0] - p[0]:+5.0f} ms")  # fmt: skip


def main(runs: int, calls: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="truss-bench-witness-"))
    key = IdentityKey.generate(ORIGIN + "-in-process")
    run_key = IdentityKey.generate(ORIGIN + "-runs")
    procs: list[subprocess.Popen[str]] = []
    try:
        lines: list[str] = []
        for name in ("w1", "w2"):
            vkeys = [key.verifier.vkey, run_key.verifier.vkey]
            proc, url, wkey = start_witness(tmp / name, f"bench.witness/{name}", vkeys)
            procs.append(proc)
            lines.append(f"witness {name} {wkey.verifier.vkey} {url}")
        policy_text = "\n".join([*lines, "group both all w1 w2", "quorum both", ""])
        in_process(tmp, key, policy_text, runs)
        by_process(tmp, run_key.private_text() + "\n", policy_text, runs, calls)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    main(args.runs, args.calls)
