"""`truss run` with telemetry on (to a local OTLP/HTTP receiver) vs off: the same run, interleaved.

A real session: ``truss run`` (a process, as a user starts it) drives ``--calls`` echo calls, one
scripted model turn each, against the wire-level test server (``tests/e2e/servers/tools.py``),
into a fresh home each time. "on" has ``[telemetry]`` in the operator config pointing at a
receiver on 127.0.0.1 (``tests/telemetry/receiver.py``: the official OTLP protobuf definitions
decoding every body), with the default protocol (``http/protobuf``) and batching; "off" has no
``[telemetry]``. Each round runs off and on back to back (alternating which goes first), so both see
the same machine load; the figure is the median over ``--rounds`` of each round's ratio, beside the
median wall times. The CPU seconds of each ``truss run`` (with the server it reaped) are measured
too: on a shared, loaded machine they move far less than wall time, so their ratio is the steadier
figure for what telemetry costs. The spans each "on" run exported are checked (all of them, none
lost). The runs' appends are fsync'd, so the disk's fsync state measured beside their homes is
printed too (``bench/_disk.py``).

Target (issue 22): on / off <= 1.05. Usage: ``python bench/telemetry.py [--calls N] [--rounds N]``.
Record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from tests.telemetry.receiver import Receiver, receiver  # noqa: E402
from truss.ledger.keys import IdentityKey  # noqa: E402

TOOLS = REPO / "tests" / "e2e" / "servers" / "tools.py"


def contract(path: Path, calls: int) -> Path:
    steps = "".join(
        f'[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = {{ text = "call {n}: the quick brown fox" }}\n'
        for n in range(calls)
    )
    path.write_text(
        f"""
[contract]
name = "bench-telemetry"
intent = "a session for the telemetry benchmark"
[agent]
final = "done"
max_turns = {calls + 1}
{steps}
[budget]
max_tool_calls = {calls}
max_model_turns = {calls + 1}
deadline = "1h"
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS))}]
allow_tools = ["echo"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:echo"
""",
        encoding="utf-8",
    )
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    root: Path, name: str, contract_path: Path, otlp: Receiver | None
) -> tuple[float, float, dict[str, object]]:
    """Wall seconds, CPU seconds (``truss`` and the server it reaped) and the run's JSON outcome."""
    home = root / name
    home.mkdir(mode=0o700)
    IdentityKey.create(home / "identity.key")
    if otlp is not None:
        (home / "config.toml").write_text(f'[telemetry]\notlp_endpoint = "{otlp.endpoint}"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["TRUSS_HOME"] = str(home)
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "truss", "--json", "run", str(contract_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=3600,
        check=False,
    )
    elapsed = time.perf_counter() - started
    cpu = _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"truss run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed, cpu, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    spans = 0
    with tempfile.TemporaryDirectory() as tmp, receiver() as otlp:
        root = Path(tmp)
        path = contract(root / "c.toml", args.calls)
        run_once(root, "warm-up", path, otlp)  # the page cache and the .pyc files, for both variants
        for n in range(args.rounds):
            order = ("off", "on") if n % 2 == 0 else ("on", "off")
            for variant in order:
                before = len(otlp.spans())
                seconds, cpu_s, outcome = run_once(root, f"{variant}-{n}", path, otlp if variant == "on" else None)
                wall[variant].append(seconds)
                cpu[variant].append(cpu_s)
                if variant == "on":
                    stats = outcome["telemetry"]
                    assert isinstance(stats, dict)
                    sent = len(otlp.spans()) - before
                    assert stats["exported"] == stats["offered"] == sent, stats  # nothing lost
                    spans = sent
            ratios.append(wall["on"][-1] / wall["off"][-1])
            cpu_ratios.append(cpu["on"][-1] / cpu["off"][-1])
            print(
                f"round {n + 1}: off {wall['off'][-1]:.2f} s ({cpu['off'][-1]:.2f} s CPU), "
                f"on {wall['on'][-1]:.2f} s ({cpu['on'][-1]:.2f} s CPU), "
                f"ratio {ratios[-1]:.3f} (CPU {cpu_ratios[-1]:.3f})"
            )
        disk = fsync_state(root)

    med = statistics.median
    print(f"session: {args.calls} calls, {args.calls + 1} model turns; {spans} spans per run with telemetry on")
    print(f"{'variant':<48} {'median':>9}  rounds")

    def row(label: str, values: list[float]) -> str:
        return f"{label:<48} {med(values):>7.2f} s  {', '.join(f'{v:.2f}' for v in values)}"

    print(row("baseline: truss run, telemetry off (wall)", wall["off"]))
    print(row("truss run, telemetry on (wall)", wall["on"]))
    print(row("baseline: telemetry off (CPU, with its server)", cpu["off"]))
    print(row("telemetry on (CPU, with its server)", cpu["on"]))
    each = ", ".join(f"{r:.3f}" for r in ratios)
    print(f"wall ratio on / off, median of the rounds' ratios: {med(ratios):.3f} (target <= 1.05); rounds: {each}")
    each = ", ".join(f"{r:.3f}" for r in cpu_ratios)
    print(f"CPU ratio on / off, median of the rounds' ratios: {med(cpu_ratios):.3f}; rounds: {each}")
    print(f"disk: {disk}")


if __name__ == "__main__":
    main()
