"""What a command that never connects costs to start: ``truss --help`` and ``truss ledger verify`` of a
small ledger against ``python -c pass``, as processes, interleaved, same run (target <= 4x).

The ledger is a fresh home with one ended session. Each command runs ``--runs`` times (default 15)
in rounds that interleave it with the baseline, so load on the machine hits all alike; medians.
Also printed: which of the heavy packages each command loaded (none of the MCP SDK, httpx2 or
pydantic should be).

What is timed is what a user runs: the ``truss`` console script next to this interpreter (``python
-m truss`` where there is none, e.g. a checkout without an install), against the same interpreter
running ``-c pass``. Every process runs with a bytecode cache (``PYTHONPYCACHEPREFIX`` in the temporary
directory, ``PYTHONDONTWRITEBYTECODE`` removed) warmed by one untimed run of each command, as an
installed package has after its first start: with the cache off, every start compiles each of
Truss's modules from source again, which is the environment's cost, not the command's.

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
SCRIPT = Path(PY).with_name("truss")
TRUSS = [str(SCRIPT)] if SCRIPT.is_file() else [PY, "-m", "truss"]
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
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(name) / "pycache")
        subprocess.run([*TRUSS, "init"], env=env, cwd=REPO, capture_output=True, timeout=60, check=True)
        ran = subprocess.run([*TRUSS, "run", "contracts/hello.toml"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
        if ran.returncode != 0:  # else `ledger verify` would time an empty ledger, not one with an ended session
            raise SystemExit(f"truss run contracts/hello.toml failed ({ran.returncode}; make peers?): {ran.stderr}")
        commands = {
            "python -c pass": [PY, "-c", "pass"],
            "truss --help": [*TRUSS, "--help"],
            "truss ledger verify": [*TRUSS, "ledger", "verify"],
            "python -m truss --help": [PY, "-m", "truss", "--help"],  # for comparison: runpy's share
        }
        for cmd in commands.values():  # warm the bytecode cache: one untimed run each
            timed(cmd, env)
        times: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(runs):
            for label, cmd in commands.items():
                times[label].append(timed(cmd, env))
        base = statistics.median(times["python -c pass"])
        print(f"start-up, {runs} interleaved runs each (medians); load {os.getloadavg()[0]:.2f}")
        shown = " ".join(os.path.relpath(a, REPO) if os.path.isabs(a) else a for a in TRUSS)
        print(f"   truss = {shown}; bytecode cache on, warmed")
        for label, values in times.items():
            ms = statistics.median(values) * 1000.0
            target = "  (target <= 4x)" if label.startswith("truss ") else ""
            print(f"   {label:22s} {ms:8.1f} ms  {statistics.median(values) / base:6.2f}x{target}")
        for argv in (["--help"], ["ledger", "verify"]):
            print(f"   heavy packages after truss {' '.join(argv)}: {loaded(argv, env) or 'none'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Start-up of commands that never connect vs python -c pass.")
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args()
    main(options.runs)
