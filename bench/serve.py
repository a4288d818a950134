"""Delegated runs through serve-mcp vs ``truss run`` of the same contract, measured in the same run.

For each round, in alternating order:

* baseline: ``truss run contracts/hello.toml`` as a subprocess (what an operator types);
* warm delegation: ``truss_run_contract {contract: "hello"}``, synchronous, on a serve-mcp
  (stdio) that a harness already has running: the call's wall time;
* cold delegation: start serve-mcp, connect, the same call, disconnect: what a harness pays when
  it spawns Truss for one run.

All three run against mcp-server-time (``make peers``) with one throwaway Truss home. Prints the
medians and the ratios against the baseline; the target is a delegated run at most 1.2x. Every
run's appends are fsync'd, so the disk's fsync state measured beside the home is printed too
(``bench/_disk.py``).

    .venv/bin/python bench/serve.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("TRUSS_PEERS") or REPO / ".peers")
sys.path.insert(0, str(REPO / "bench"))

from _disk import fsync_state  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{PEERS / 'py' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TRUSS_HOME", None)
    return env


def truss_run(home: Path, contracts: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "truss", "--home", str(home), "run", str(contracts / "hello.toml")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"truss run failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def _params(home: Path, contracts: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "truss", "--home", str(home), "serve-mcp", "--contracts-dir", str(contracts)],
        env=_env(),
    )


async def _call(client: Client) -> float:
    start = time.perf_counter()
    result = await client.call_tool("truss_run_contract", {"contract": "hello"})
    elapsed = time.perf_counter() - start
    if result.is_error or (result.structured_content or {}).get("status") != "pass":
        raise SystemExit(f"delegated run did not pass: {result.content}")
    return elapsed


async def cold(home: Path, contracts: Path, errlog: Path) -> float:
    start = time.perf_counter()
    with errlog.open("a") as log:
        async with Client(stdio_client(_params(home, contracts), errlog=log), read_timeout_seconds=300) as client:  # pyright: ignore[reportArgumentType]
            await _call(client)
    return time.perf_counter() - start


def _init(home: Path) -> None:
    subprocess.run([sys.executable, "-m", "truss", "--home", str(home), "init"], check=True, capture_output=True)
    if not (home / "identity.key").exists():
        from truss.ledger.keys import IdentityKey

        IdentityKey.create(home / "identity.key")


async def main_async(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="truss-bench-serve-"))
    try:
        home = work / "home"
        contracts = work / "contracts"
        contracts.mkdir()
        shutil.copy(REPO / "contracts" / "hello.toml", contracts / "hello.toml")
        _init(home)
        errlog = work / "serve.stderr.log"
        base: list[float] = []
        warm: list[float] = []
        cold_runs: list[float] = []
        with errlog.open("a") as log:
            async with Client(stdio_client(_params(home, contracts), errlog=log), read_timeout_seconds=300) as client:  # pyright: ignore[reportArgumentType]
                await _call(client)  # warm-up: imports, first store open
                truss_run(home, contracts)
                for i in range(rounds):
                    order = ("base", "warm", "cold") if i % 2 == 0 else ("cold", "warm", "base")
                    for kind in order:
                        if kind == "base":
                            base.append(await anyio.to_thread.run_sync(truss_run, home, contracts))
                        elif kind == "warm":
                            warm.append(await _call(client))
                        else:
                            cold_runs.append(await cold(home, contracts, errlog))
                    print(
                        f"round {i + 1}: truss run {base[-1] * 1000:.0f} ms, "
                        f"warm {warm[-1] * 1000:.0f} ms, cold {cold_runs[-1] * 1000:.0f} ms",
                        flush=True,
                    )
        disk = fsync_state(work)
        b, w, c = statistics.median(base), statistics.median(warm), statistics.median(cold_runs)
        print(f"\nmedians over {rounds} rounds (load average {os.getloadavg()[0]:.1f}):")
        print(f"  truss run contracts/hello.toml (baseline)  {b * 1000:8.0f} ms")
        print(f"  truss_run_contract on a running serve-mcp  {w * 1000:8.0f} ms   ratio {w / b:.2f}")
        print(f"  spawn serve-mcp + connect + call + close   {c * 1000:8.0f} ms   ratio {c / b:.2f}")
        print(f"  disk: {disk}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    anyio.run(main_async, args.rounds)


if __name__ == "__main__":
    main()
