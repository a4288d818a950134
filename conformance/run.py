"""Run the MCP conformance suite against Truss, in server mode or client mode, offline.

Server mode tests ``truss serve-mcp --transport http``: serve-mcp runs on 127.0.0.1 with
``--unsafe-no-auth`` (the suite cannot send a bearer token; no other host can reach the namespace)
against a throwaway Truss home and the repository's ``contracts/``.

Client mode tests Truss's client tier: ``conformance client --requirements <revision>`` runs every
client scenario the revision requires (and the not-scored extension scenarios) with
``conformance/client.py`` as the client under test, which drives Truss through its CLI. Every
scenario's client shares one throwaway Truss home; the driver takes a lock file so that Truss runs
one scenario at a time (the suite starts them all at once). Afterwards every session recorded in
that home must verify (``truss ledger verify --all``), and the not-scored scenarios' results are
printed.

The suite and its mock servers listen on all interfaces, so the whole run happens inside a fresh
network namespace (``unshare --net --map-root-user``) whose only interface is ``lo``: nothing is
reachable from outside and nothing outside is reached.

    python conformance/run.py --spec-version 2026-07-28                  # server mode, or 2025-11-25
    python conformance/run.py --mode client --spec-version 2026-07-28    # client mode, or 2025-11-25

Exit codes: the suite's (0: only the expected failures of ``expected-failures-<version>.yml``, or in
client mode ``expected-failures-client-<version>.yml``, failed, and no listed failure passed), 1 also
when a recorded session does not verify, 77 when network namespaces are not permitted here or the
suite is not installed (callers treat that as a skip). Needs ``make peers`` (Node 22 and the suite
in ``.peers/node22``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = Path(os.environ.get("TRUSS_PEERS") or REPO / ".peers")
NODE22 = PEERS / "node22" / "node_modules"
SKIP = 77


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=("server", "client"), default="server", help="what the suite tests")
    parser.add_argument("--spec-version", required=True, choices=("2025-11-25", "2026-07-28"))
    parser.add_argument("--output", help="directory for the suite's results (default: a temporary one)")
    parser.add_argument(
        "--extension",
        choices=("tasks",),
        help="server mode: run an extension's scenarios (not part of --suite all) against their own baseline",
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        _loopback_up()
        if args.mode == "client":
            return inside_client(args.spec_version, args.output)
        return inside(args.spec_version, args.output, args.extension)
    conformance = NODE22 / ".bin" / "conformance"
    if not conformance.exists():
        print(f"conformance suite not installed under {NODE22}: run `make peers`", file=sys.stderr)
        return SKIP
    if shutil.which("unshare") is None:
        print("network namespaces are not available here (no unshare command); not running", file=sys.stderr)
        return SKIP
    probe = subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        print("network namespaces are not permitted here (unshare --net failed); not running", file=sys.stderr)
        return SKIP
    command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--inside"]
    return subprocess.run(["unshare", "--net", "--map-root-user", *command], check=False, timeout=1800).returncode


def _loopback_up() -> None:
    """Bring ``lo`` up in the new namespace with SIOCSIFFLAGS (as ``ip link set lo up`` does), so a
    machine without iproute2 can run the suite too."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    layout = "16sH22x"  # struct ifreq: the interface name, then ifr_flags in the 24-byte union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack(layout, fcntl.ioctl(sock, siocgifflags, struct.pack(layout, b"lo", 0)))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack(layout, b"lo", flags | iff_up))


def _suite_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    node_bin = NODE22 / "node" / "bin"
    env["PATH"] = os.pathsep.join([str(PEERS / "py" / "bin"), str(node_bin), env.get("PATH", "")])
    env["HOME"] = str(work)  # npm tools write caches under HOME
    return env


# The Tasks extension's server scenarios (SEP-2663); `conformance list --server` marks them [extension].
EXTENSION_SCENARIOS = {
    "tasks": (
        "tasks-capability-negotiation",
        "tasks-lifecycle",
        "tasks-wire-fields",
        "tasks-request-state-removal",
        "tasks-dispatch-and-envelope",
        "tasks-request-headers",
        "tasks-required-task-error",
    ),
}


def inside(spec_version: str, output: str | None, extension: str | None = None) -> int:
    work = Path(tempfile.mkdtemp(prefix="truss-conformance-"))
    try:
        home = work / "home"
        home.mkdir(mode=0o700)
        from truss.ledger.keys import IdentityKey

        IdentityKey.create(home / "identity.key")
        env = _suite_env(work)
        serve = subprocess.Popen(
            [
                *(sys.executable, "-m", "truss", "--home", str(home), "serve-mcp"),
                *("--contracts-dir", str(REPO / "contracts"), "--transport", "http", "--port", "0", "--unsafe-no-auth"),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        urls: queue.Queue[str] = queue.Queue()

        def read() -> None:
            assert serve.stderr is not None
            for line in serve.stderr:
                sys.stderr.write(line)
                if "listening on " in line:
                    urls.put(line.split("listening on ", 1)[1].strip())

        threading.Thread(target=read, daemon=True).start()
        try:
            url = urls.get(timeout=60)
            results = output or str(work / "results")
            if extension is not None:
                baseline = HERE / f"expected-failures-{extension}-{spec_version}.yml"
                worst = 0
                for scenario in EXTENSION_SCENARIOS[extension]:
                    one = [
                        *(str(NODE22 / ".bin" / "conformance"), "server", "--url", url, "--scenario", scenario),
                        *("--expected-failures", str(baseline), "-o", results),
                    ]
                    worst = max(worst, subprocess.run(one, env=env, check=False, timeout=600).returncode)
                return worst
            baseline = HERE / f"expected-failures-{spec_version}.yml"
            suite = [
                *(str(NODE22 / ".bin" / "conformance"), "server", "--url", url, "--suite", "all"),
                *("--spec-version", spec_version, "--expected-failures", str(baseline), "-o", results),
            ]
            return subprocess.run(suite, env=env, check=False, timeout=600).returncode
        finally:
            serve.terminate()
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait(timeout=10)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def inside_client(revision: str, output: str | None) -> int:
    work = Path(tempfile.mkdtemp(prefix="truss-conformance-client-"))
    try:
        home = work / "home"
        env = _suite_env(work)
        env["TRUSS_HOME"] = str(home)
        env["TRUSS_CONFORMANCE_LOCK"] = str(work / "truss.lock")
        truss = [sys.executable, "-m", "truss", "--home", str(home)]
        subprocess.run([*truss, "init"], env=env, check=True, capture_output=True, timeout=120)
        results = output or str(work / "results")
        suite = [
            *(str(NODE22 / ".bin" / "conformance"), "client", "--requirements", revision),
            # The suite splits --command on spaces: the paths must have none.
            *("--command", f"{sys.executable} {HERE / 'client.py'}"),
            *("--expected-failures", str(HERE / f"expected-failures-client-{revision}.yml"), "-o", results),
            # Per scenario, from the suite's start of all of them: the driver runs Truss one scenario
            # at a time, so the last one waits for all the others.
            *("--timeout", "600000"),
        ]
        if any(" " in part for part in (sys.executable, str(HERE))):
            print("the suite cannot run a client whose path holds a space", file=sys.stderr)
            return SKIP
        code = subprocess.run(suite, env=env, check=False, timeout=1700).returncode
        _print_not_scored(revision, Path(results), env)
        verified = subprocess.run([*truss, "ledger", "verify", "--all"], env=env, check=False, timeout=300)
        if verified.returncode != 0:
            print("a session the conformance client recorded does not verify", file=sys.stderr)
            return code or 1
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _print_not_scored(revision: str, results: Path, env: dict[str, str]) -> None:
    """The not-scored client scenarios of ``revision`` (extensions and the like) and how each went."""
    listing = subprocess.run(
        [str(NODE22 / ".bin" / "conformance"), "list", "--requirements", revision],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    reasons: dict[str, str] = {}
    reason = ""
    in_section = False
    for line in listing.stdout.splitlines():
        if line.startswith("Run and reported, but never scored"):
            in_section = True
        elif in_section and line.startswith("  ") and not line.startswith("    "):
            reason = line.strip().split(" ")[0]
        elif in_section and line.strip().startswith("- ") and line.rstrip().endswith("[client]"):
            reasons[line.strip()[2:].rsplit(" ", 1)[0]] = reason
    if not reasons:
        return
    print(f"\nNot scored for {revision} (run and reported; they do not count):")
    for name, why in reasons.items():
        statuses: list[str] = []
        for checks in results.glob(f"{name}-*/checks.json"):
            # The suite names each result directory after the scenario and the run's start time.
            if re.fullmatch(re.escape(Path(name).name) + r"-\d{4}-\d{2}-\d{2}T[\d-]+Z", checks.parent.name):
                statuses += [str(c.get("status")) for c in json.loads(checks.read_text(encoding="utf-8"))]
        passed, failed, warned = (statuses.count(s) for s in ("SUCCESS", "FAILURE", "WARNING"))
        mark = "pass" if statuses and not failed and not warned else "FAIL"
        print(f"  {mark:4}  {name} ({why}): {passed} passed, {failed} failed, {warned} warnings")


if __name__ == "__main__":
    sys.exit(main())
