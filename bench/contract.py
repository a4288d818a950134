"""What loading a contract costs, against baselines measured in the same run.

1. in-process: ``load_contract_text`` of ``contracts/full-reference.toml`` (parse, per-file value
   checks, layering, validation, reference checks, params, hash) vs the bare minimum (``tomllib``
   + ``Contract.model_validate`` + ``contract_hash``); the same with an operator config, an agent
   file and an overlay; and a bad contract (unknown key) reported with file, key path and line
   vs catching pydantic's own ``ValidationError``;
2. start-up: ``truss contract check contracts/hello.toml`` as a process vs ``python -c pass``,
   and what the lazy MCP import saves: ``import truss_cli.main`` vs ``import mcp.client``.

Usage: ``python bench/contract.py [--loads N] [--rounds R] [--starts N]``. Rounds interleave the
measured and the baseline so that load on the machine hits both alike; medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pydantic import ValidationError  # noqa: E402

from truss import ContractError  # noqa: E402
from truss.contract import Contract, contract_hash, load_contract_text  # noqa: E402

FULL = (REPO / "contracts" / "full-reference.toml").read_text()
BAD = FULL.replace('transport = "http"', 'transport = "http"\ntransprot = "x"', 1)
CONFIG = """
[budget]
max_model_turns = 12
[agent]
max_parallel_calls = 2
[[mcp.servers]]
name = "files"
connect_timeout = "5s"
[harness]
allow_hosts = ["*.example.com"]
allow_commands = ["mcp-server-filesystem"]
"""
AGENT = '[agent]\nmax_turns = 8\nsystem = "be brief"\n'
OVERLAY = '[[mcp.servers]]\nname = "ops"\ncall_timeout = "20s"\n'


def _per_call_us(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def _baseline() -> object:
    return contract_hash(Contract.model_validate(tomllib.loads(FULL)))


def _load() -> object:
    return load_contract_text(FULL, source="full-reference.toml")


def _load_layers() -> object:
    return load_contract_text(
        FULL,
        source="full-reference.toml",
        config=("config.toml", CONFIG),
        agent=("agent.toml", AGENT),
        overlay=("overlay.toml", OVERLAY),
    )


def _bad_baseline() -> object:
    try:
        Contract.model_validate(tomllib.loads(BAD))
    except ValidationError as exc:
        return exc
    raise AssertionError("the bad contract validated")


def _bad_load() -> object:
    try:
        load_contract_text(BAD, source="bad.toml")
    except ContractError as exc:
        assert exc.fields["line"] is not None
        return exc.diagnostics()
    raise AssertionError("the bad contract loaded")


def _process_s(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--loads", type=int, default=200, help="loads per measurement (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--starts", type=int, default=7, help="process starts per measurement (default 7)")
    args = parser.parse_args()

    pairs = {
        "load full-reference.toml": (_load, _baseline),
        "load with config + agent + overlay": (_load_layers, _baseline),
        "bad contract: located ContractError": (_bad_load, _bad_baseline),
    }
    for fn, base in pairs.values():  # warm up imports and pydantic's caches
        fn()
        base()
    samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    for _ in range(args.rounds):
        for name, (fn, base) in pairs.items():
            samples[name][0].append(_per_call_us(fn, args.loads))
            samples[name][1].append(_per_call_us(base, args.loads))
    print(f"in-process, {args.loads} loads x {args.rounds} rounds (median µs per load)")
    print(f"{'measure':40} {'truss':>10} {'baseline':>10} {'ratio':>7}")
    for name, (measured, baseline) in samples.items():
        m, b = statistics.median(measured), statistics.median(baseline)
        print(f"{name:40} {m:10.0f} {b:10.0f} {m / b:7.2f}")

    py = sys.executable
    starts = {
        "truss contract check hello.toml": [py, "-m", "truss", "contract", "check", "contracts/hello.toml"],
        "python -c pass": [py, "-c", "pass"],
        "import truss_cli.main": [py, "-c", "import truss_cli.main"],
        "import mcp.client": [py, "-c", "import mcp.client"],
    }
    times: dict[str, list[float]] = {k: [] for k in starts}
    for _ in range(args.starts):
        for name, argv in starts.items():
            times[name].append(_process_s(argv))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"\nprocess start, {args.starts} runs each (median ms)")
    for name, value in med.items():
        print(f"{name:40} {value:10.0f}")
    check, bare = med["truss contract check hello.toml"], med["python -c pass"]
    print(f"{'contract check over bare python':40} {check / bare:10.2f}x")
    saved = med["import mcp.client"] / med["import truss_cli.main"]
    print(f"{'mcp.client import over truss_cli import':40} {saved:10.2f}x")


if __name__ == "__main__":
    main()
