"""The HTML report of a 1,000-call session: its size, and how long the browser takes to verify it.

A real session: ``truss run`` drives ``--calls`` echo calls (one model turn each, scripted) against
the wire-level test server, then ``truss ledger export`` and ``truss ledger report`` write the
bundle and the page. Measured, ``--runs`` times each, medians:

- the page in headless Chromium (Debian's ``chromium``, over the DevTools protocol): the time its
  own verification takes (B1-B8 over the embedded bundle, WebCrypto), and the time from navigation
  to a fully rendered, verified page;
- the baseline, in the same run: ``truss.ledger.bundle.verify_bundle`` over the same bytes in this
  process (what ``truss ledger verify --bundle`` does after start-up), and the CLI itself.

Usage: ``python bench/report.py [--calls N] [--runs N]``; needs ``apt-get install chromium``.
Record results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.report.cdp import Browser, find_chromium  # noqa: E402
from truss.ledger.bundle import verify_bundle  # noqa: E402
from truss.ledger.keys import TrustedKeys, VerifierKey  # noqa: E402

TOOLS = REPO / "tests" / "e2e" / "servers" / "tools.py"


def truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    done = subprocess.run(
        [sys.executable, "-m", "truss", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=3600,
        check=False,
    )
    if done.returncode not in (0,):
        raise SystemExit(f"truss {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def contract(path: Path, calls: int) -> Path:
    steps = "".join(
        f'[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = {{ text = "call {n}: the quick brown fox" }}\n'
        for n in range(calls)
    )
    path.write_text(
        f"""
[contract]
name = "bench-report"
intent = "a long session for the report benchmark"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("needs Debian's chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home = root / "home"
        truss(home, "init")
        started = time.perf_counter()
        truss(home, "run", str(contract(root / "c.toml", args.calls)), "--session", "long")
        print(f"truss run of {args.calls} calls: {time.perf_counter() - started:.1f} s (setup, not measured)")
        bundle_path, page_path = root / "bundle.json", root / "report.html"
        truss(home, "ledger", "export", "long", "-o", str(bundle_path))
        truss(home, "ledger", "report", "long", "-o", str(page_path))
        data = bundle_path.read_bytes().rstrip(b"\n")
        report_bytes = page_path.stat().st_size
        entries = len(json.loads(data)["entries"])
        vkey = truss(home, "key", "show").stdout.strip().splitlines()[-1]
        trusted = TrustedKeys([VerifierKey.parse(vkey)])

        python_ms: list[float] = []
        cli_ms: list[float] = []
        page_verify_ms: list[float] = []
        page_ready_ms: list[float] = []
        with Browser(chromium, timeout=600) as browser:
            for _ in range(args.runs):
                t0 = time.perf_counter()
                report = verify_bundle(data, trusted)
                python_ms.append((time.perf_counter() - t0) * 1000)
                assert report.ok, report.message
                t0 = time.perf_counter()
                truss(home, "ledger", "verify", "--bundle", str(bundle_path), "--trusted-key", vkey)
                cli_ms.append((time.perf_counter() - t0) * 1000)
                page = browser.page()
                page.open(page_path.as_uri(), timeout=600)
                summary = page.evaluate("window.trussReport.after(0)", timeout=600)
                assert summary["ok"], summary["message"]
                assert page.requests() == [page_path.as_uri()]
                page_verify_ms.append(float(summary["ms"]))
                page_ready_ms.append(float(summary["at"]))
                page.close()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    print(f"session: {args.calls} calls, {entries} entries")
    print(f"bundle: {len(data):,} bytes; report: {report_bytes:,} bytes ({report_bytes / len(data):.2f}x the bundle)")
    print(f"{'measure':<52} {'median':>10}  runs")
    rows = [
        ("verify in the page (B1-B8, WebCrypto)", page_verify_ms),
        ("navigation to a verified, rendered page", page_ready_ms),
        ("baseline: verify_bundle in Python, same bytes", python_ms),
        ("baseline: truss ledger verify --bundle (process)", cli_ms),
    ]
    for name, values in rows:
        print(f"{name:<52} {med(values):>8.0f} ms  {', '.join(f'{v:.0f}' for v in values)}")
    print(f"ratio page verify / Python verify_bundle: {med(page_verify_ms) / med(python_ms):.2f}")
    print(f"ratio page ready / truss ledger verify --bundle: {med(page_ready_ms) / med(cli_ms):.2f}")


if __name__ == "__main__":
    main()
