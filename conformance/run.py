"""Run the MCP conformance suite (server mode) against ``truss serve-mcp --transport http``.

The suite and its mock servers listen on all interfaces, so the whole run happens inside a fresh
network namespace (``unshare --net --map-root-user``) whose only interface is ``lo``: nothing is
reachable from outside and nothing outside is reached. Inside, serve-mcp runs on 127.0.0.1 with
``--unsafe-no-auth`` (the suite cannot send a bearer token; no other host can reach the
namespace) against a throwaway Truss home and the repository's ``contracts/``.

    python conformance/run.py --spec-version 2026-07-28     # or 2025-11-25

Exit codes: the suite's (0: only the expected failures of ``expected-failures-<version>.yml``
failed), 77 when network namespaces are not permitted here (callers treat that as a skip).
Needs ``make peers`` (Node 22 and the suite in ``.peers/node22``).
"""

from __future__ import annotations

import argparse
import os
import queue
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-version", required=True, choices=("2025-11-25", "2026-07-28"))
    parser.add_argument("--output", help="directory for the suite's results (default: a temporary one)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(args.spec_version, args.output)
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
    return subprocess.run(["unshare", "--net", "--map-root-user", *command], check=False, timeout=900).returncode


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


def inside(spec_version: str, output: str | None) -> int:
    _loopback_up()
    work = Path(tempfile.mkdtemp(prefix="truss-conformance-"))
    try:
        home = work / "home"
        home.mkdir(mode=0o700)
        from truss.ledger.keys import IdentityKey

        IdentityKey.create(home / "identity.key")
        env = dict(os.environ)
        node_bin = NODE22 / "node" / "bin"
        env["PATH"] = os.pathsep.join([str(PEERS / "py" / "bin"), str(node_bin), env.get("PATH", "")])
        env["HOME"] = str(work)  # npm tools write caches under HOME
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


if __name__ == "__main__":
    sys.exit(main())
