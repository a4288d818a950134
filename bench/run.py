"""``truss run contracts/hello.toml`` vs the raw SDK making the same calls, as processes, same run.

Both are timed from process start to exit, interleaved, ``--runs`` times (default 7); medians.
The baseline is a Python process that imports the ``mcp`` SDK, connects to the same
mcp-server-time over stdio, calls ``get_current_time`` and ``convert_time`` as the contract's
scripted plan does, and exits. Where Truss's extra time goes is read from the run itself: the
``ts`` of its ledger entries split the run into start-up (interpreter, imports, contract, key,
connecting the server) up to ``session_started``, the loop up to the last ``model_turn``,
closing the server up to ``verdict``, and the end (``session_ended``, checkpoint, envelope, exit).
The run's appends are fsync'd, so the disk's fsync state measured beside its home is printed too
(``bench/_disk.py``).

Usage: ``python bench/run.py [--runs N]``; needs ``make peers``. Record results in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402

CLOCK = SystemClock()
PY = sys.executable
PEERS_BIN = REPO / ".peers" / "py" / "bin"

RAW = """
import os, sys, anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["--local-timezone", "UTC"])
    with open(os.devnull, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="auto", cache=None, read_timeout_seconds=10) as c:
            first = await c.call_tool("get_current_time", {"timezone": "UTC"})
            zone = first.structured_content["timezone"]
            second = await c.call_tool(
                "convert_time", {"source_timezone": zone, "time": "12:00", "target_timezone": "Asia/Tokyo"}
            )
            assert not first.is_error and not second.is_error

anyio.run(main)
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{cmd[:4]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed, done


def phases(db: Path, session: str) -> tuple[int, int, int, int]:
    """Milliseconds (ledger ``ts``): ``session_started``, the last ``model_turn``, ``verdict``, ``session_ended``."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT kind, ts FROM entries WHERE session = ? ORDER BY seq", (session,)).fetchall()
    ts = {kind: t for kind, t in rows}  # the last of each kind
    return ts["session_started"], ts["model_turn"], ts["verdict"], ts["session_ended"]


def main(runs: int) -> None:
    server = PEERS_BIN / "mcp-server-time"
    if not server.exists():
        sys.exit("mcp-server-time is not installed: run `make peers`")
    tmp = Path(tempfile.mkdtemp(prefix="truss-bench-run-"))
    home = tmp / "home"
    env = dict(os.environ)
    env["PATH"] = f"{PEERS_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TRUSS_HOME"] = str(home)
    raw_script = tmp / "raw.py"
    raw_script.write_text(RAW, encoding="utf-8")
    timed([PY, "-m", "truss", "init"], env)
    truss_cmd = [PY, "-m", "truss", "run", "contracts/hello.toml", "--json"]
    raw_cmd = [PY, str(raw_script), str(server)]
    bare_cmd = [PY, "-c", "import mcp, truss_cli.main"]
    timed(truss_cmd, env)  # warm the file cache for both
    timed(raw_cmd, env)
    truss_s: list[float] = []
    raw_s: list[float] = []
    imports_s: list[float] = []
    split: list[tuple[float, ...]] = []
    for _ in range(runs):
        start_ms = CLOCK.now_ms()  # the ledger's ts are wall-clock ms
        elapsed, done = timed(truss_cmd, env)
        end_ms = start_ms + elapsed * 1000
        truss_s.append(elapsed)
        session = json.loads(done.stdout)["session"]
        started, last_turn, verdict, ended = phases(home / "ledger.db", session)
        split.append((started - start_ms, last_turn - started, verdict - last_turn, ended - verdict, end_ms - ended))
        raw_s.append(timed(raw_cmd, env)[0])
        imports_s.append(timed(bare_cmd, env)[0])
    disk = fsync_state(tmp)
    t, r = statistics.median(truss_s), statistics.median(raw_s)
    print(f"{runs} runs each, interleaved; medians")
    print(f"  raw SDK, same calls     {r * 1000:7.0f} ms")
    print(f"  truss run hello.toml    {t * 1000:7.0f} ms   ratio {t / r:.2f}")
    print(f"  python -c 'import mcp, truss_cli.main'  {statistics.median(imports_s) * 1000:7.0f} ms")
    print(f"  disk: {disk}")
    names = [
        "start-up + connect (to session_started)",
        "loop: 3 turns, 2 calls (to the last model_turn)",
        "closing the server (to verdict)",
        "verdict + session_ended",
        "checkpoint, envelope, exit",
    ]
    for i, name in enumerate(names):
        print(f"  {name:<42} {statistics.median(s[i] for s in split):7.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    main(parser.parse_args().runs)
