"""What a command that never connects costs to start: ``truss --help`` and ``truss ledger verify`` of a
small ledger against ``python -c pass``, as processes, interleaved, same run (target <= 4x).

The ledger is a fresh home with one ended session. Each command runs ``--runs`` times (default 15)
in rounds that interleave it with the baseline, so load on the machine hits all alike; medians.
Also printed: which of the heavy packages each command loaded (none of the MCP SDK, httpx2 or
pydantic should be).

Usage: ``python bench/startup.py [--runs N]``. Record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TRUSS = [PY, "-m", "truss"]
HEAVY = ("mcp", "httpx2", "pydantic")


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env=env, cwd=REPO, timeout=60, check=False)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    return elapsed


def loaded(argv: list[str], env: dict[str, str]) -> list[str]:
    code = (
        "import sys, io, contextlib\nfrom truss_cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try: main({argv!r})\n    except SystemExit: pass\n"
        f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=True)
    return done.stdout.split()


def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        home = Path(name) / "home"
        peers = str(REPO / ".peers" / "py" / "bin")
        env = {**os.environ, "TRUSS_HOME": str(home), "PATH": peers + os.pathsep + os.environ.get("PATH", "")}
        subprocess.run([*TRUSS, "init"], env=env, cwd=REPO, capture_output=True, timeout=60, check=True)
        ran = subprocess.run([*TRUSS, "run", "contracts/hello.toml"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
        if ran.returncode != 0:  # else `ledger verify` would time an empty ledger, not one with an ended session
            raise SystemExit(f"truss run contracts/hello.toml failed ({ran.returncode}; make peers?): {ran.stderr}")
        commands = {
            "python -c pass": [PY, "-c", "pass"],
            "truss --help": [*TRUSS, "--help"],
            "truss ledger verify": [*TRUSS, "ledger", "verify"],
        }
        times: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(runs):
            for label, cmd in commands.items():
                times[label].append(timed(cmd, env))
        base = statistics.median(times["python -c pass"])
        print(f"start-up, {runs} interleaved runs each (medians); load {os.getloadavg()[0]:.2f}")
        for label, values in times.items():
            ms = statistics.median(values) * 1000.0
            print(f"   {label:22s} {ms:8.1f} ms  {statistics.median(values) / base:6.2f}x  (target <= 4x)")
        for argv in (["--help"], ["ledger", "verify"]):
            print(f"   heavy packages after truss {' '.join(argv)}: {loaded(argv, env) or 'none'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Start-up of commands that never connect vs python -c pass.")
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args()
    main(options.runs)
