"""The MCP client tier's own costs, each against a baseline measured in the same run.

Run: ``.venv/bin/python bench/mcp_client.py [--rounds R] [--calls N]`` (needs ``make peers``).

- connect: ``truss.mcp.client.connect`` of four stdio servers at once (mcp-server-time,
  mcp-server-git, server-everything, and a small SDK-less server) against each of them alone,
  rounds interleaved; the ratio is the median of "all four" over the median of the slowest one
  alone (target <= 1.3). Time to a usable ``Mounts``: spawn, handshake, tools/list, mount.
- connect, light: the same with four SDK-less servers, which need almost no CPU to start, so
  the ratio shows what the tier's own concurrency costs apart from the servers' CPU.
- call: ``Mounts.call`` on a mounted tool against the raw SDK ``Client.call_tool`` of the same
  tool over the same connection, calls interleaved in pairs; the ratio is of the medians (target
  <= 1.05). Both pay the same server and pipe; the difference is the tier's pin checks, timeout
  scope, ``_meta`` stripping and result size check.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import node_peer, python_peer  # noqa: E402
from truss._clock import SystemClock  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.mcp.client import connect  # noqa: E402

RAW = str(REPO / "tests" / "mcp" / "servers" / "raw.py")


def servers(repo: Path) -> list[dict[str, Any]]:
    node, script = node_peer("server-everything")
    return [
        {"name": "time", "command": python_peer("mcp-server-time"), "allow_tools": ["get_current_time"]},
        {
            "name": "git",
            "command": python_peer("mcp-server-git"),
            "args": ["--repository", str(repo)],
            "allow_tools": ["git_status"],
        },
        {"name": "every", "command": node, "args": [script, "stdio"], "allow_tools": ["echo"]},
        {"name": "raw", "command": sys.executable, "args": [RAW, "ok"], "allow_tools": ["echo"]},
    ]


def contract(entries: list[dict[str, Any]]) -> Contract:
    return Contract.model_validate({"contract": {"name": "bench", "intent": "bench"}, "mcp": {"servers": entries}})


async def time_connect(entries: list[dict[str, Any]], logs: Path) -> float:
    clock = SystemClock()
    start = time.perf_counter()
    async with connect(contract(entries), log_dir=logs, clock=clock):
        elapsed = time.perf_counter() - start
    return elapsed


async def bench_connect(entries: list[dict[str, Any]], logs: Path, rounds: int, label: str = "") -> None:
    alone: dict[str, list[float]] = {e["name"]: [] for e in entries}
    together: list[float] = []
    await time_connect(entries, logs)  # warm the OS caches once
    for _ in range(rounds):
        for entry in entries:
            alone[entry["name"]].append(await time_connect([entry], logs))
        together.append(await time_connect(entries, logs))
    medians = {name: statistics.median(values) for name, values in alone.items()}
    slowest = max(medians, key=lambda n: medians[n])
    both = statistics.median(together)
    for name, value in medians.items():
        print(f"connect{label} {name:<6} alone   median {value * 1000:7.1f} ms")
    print(f"connect{label} all four at once  median {both * 1000:7.1f} ms")
    ratio = both / medians[slowest]
    print(f"connect{label} ratio: all four / slowest alone ({slowest}) = {ratio:.2f}  (target <= 1.3)")


async def bench_call(logs: Path, calls: int, rounds: int) -> None:
    entry = {"name": "raw", "command": sys.executable, "args": [RAW, "ok"], "allow_tools": ["echo"]}
    async with connect(contract([entry]), log_dir=logs, clock=SystemClock()) as mounts:
        tool = mounts.tools["mcp:raw:echo"]
        client = mounts._lives["raw"].client  # pyright: ignore[reportPrivateUsage] - the same connection, raw
        assert client is not None
        for _ in range(50):  # warm up both paths
            await mounts.call(tool, {"text": "hi"}, timeout_s=10)
            await client.call_tool("echo", {"text": "hi"}, read_timeout_seconds=10)
        ratios: list[float] = []
        all_tier: list[float] = []
        all_raw: list[float] = []
        for _ in range(rounds):
            tier: list[float] = []
            raw: list[float] = []
            for i in range(calls):
                # Alternate which path goes first so neither always follows the other.
                for which in (0, 1) if i % 2 == 0 else (1, 0):
                    start = time.perf_counter()
                    if which == 0:
                        await mounts.call(tool, {"text": "hi"}, timeout_s=10)
                        tier.append(time.perf_counter() - start)
                    else:
                        await client.call_tool("echo", {"text": "hi"}, read_timeout_seconds=10)
                        raw.append(time.perf_counter() - start)
            ratios.append(statistics.median(tier) / statistics.median(raw))
            all_tier += tier
            all_raw += raw
    a, b = statistics.median(all_tier), statistics.median(all_raw)
    print(f"call through Mounts.call  median {a * 1e6:7.0f} µs over {len(all_tier)} calls")
    print(f"call raw SDK call_tool    median {b * 1e6:7.0f} µs over {len(all_raw)} calls")
    shown = ", ".join(f"{r:.3f}" for r in ratios)
    print(f"call ratio per round: {shown}")
    ratio = statistics.median(ratios)
    print(f"call ratio: Mounts.call / raw call_tool = {ratio:.3f} (median of rounds; target <= 1.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each measure (default 5)")
    parser.add_argument("--calls", type=int, default=500, help="calls per path per round (default 500)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
        logs = Path(scratch) / "logs"

        async def run() -> None:
            await bench_call(logs, args.calls, args.rounds)
            await bench_connect(servers(repo), logs, args.rounds)
            # Four servers that need almost no CPU to start: what the tier's own concurrency costs.
            light = [
                {"name": f"raw{i}", "command": sys.executable, "args": [RAW, "ok"], "allow_tools": ["echo"]}
                for i in range(4)
            ]
            await bench_connect(light, logs, args.rounds, label=" (SDK-less servers)")

        anyio.run(run)


if __name__ == "__main__":
    main()
