"""What OAuth costs a call and a connect, against baselines measured in the same run.

Starts ``tests/mcp/servers/oauth_servers.py`` (the MCP SDK's authorization server and an
OAuth-protected SDK MCP server on 127.0.0.1) and connects to the same server two ways through
``truss.mcp.client.connect``:

1. per call: OAuth with a cached token (``OAuthFlows``, the token in the store) vs a static
   ``Authorization: Bearer`` header holding a token fetched once for the same resource; rounds
   alternate the two, ``--calls`` calls each; the median per-call time and the ratio (target
   ≤ 1.05×);
2. per connect: a connect whose stored token must be refreshed first (its stored expiry set in
   the past) vs one with a valid token; the refresh's share of the connect;
3. the auth flow alone, per request: the OAuth provider of a connection holding a valid token,
   driven as httpx drives it (one request, its 200 response) against httpx's no-op ``Auth``, so
   the flow's own work is seen without the server's and the load's noise around it; the ratio.

The token store is the encrypted file (``TRUSS_OAUTH_STORE=file``), whose writes are fsync'd: the
refresh cost includes that, so the disk's fsync state measured in the same directory is printed
beside it (``bench/_disk.py``).

Usage: ``python bench/oauth.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ["TRUSS_OAUTH_STORE"] = "file"

from _disk import fsync_state  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.mcp.client import Mounts, connect  # noqa: E402
from truss.mcp.oauth import OAuthFlows, TokenStore  # noqa: E402

SERVERS = REPO / "tests" / "mcp" / "servers" / "oauth_servers.py"


def _contract(url: str, *, oauth: bool) -> Contract:
    server: dict[str, Any] = {"name": "a", "transport": "http", "url": url, "allow_tools": ["echo"]}
    if oauth:
        server["oauth"] = {"grant": "client_credentials", "client_id": "cc-client", "client_secret_env": "CC_SECRET"}
    else:
        server["headers"] = {"Authorization": {"secret_env": "BEARER", "format": "Bearer {}"}}
    return Contract.model_validate({"contract": {"name": "b", "intent": "bench"}, "mcp": {"servers": [server]}})


def _token(issuer: str, resource: str) -> str:
    form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": "cc-client",
                                   "client_secret": "cc-secret-value", "resource": resource}).encode()  # fmt: skip
    with urllib.request.urlopen(f"{issuer}/token", data=form, timeout=10) as response:
        return str(json.loads(response.read())["access_token"])


@contextlib.asynccontextmanager
async def _mounts(contract: Contract, home: Path, environ: dict[str, str]) -> AsyncIterator[Mounts]:
    flows = OAuthFlows(TokenStore(home / "oauth"), SystemClock(), environ=environ)
    async with connect(contract, log_dir=home / "logs", clock=SystemClock(), environ=environ, auth=flows) as mounts:
        yield mounts


async def _per_call_ms(mounts: Mounts, calls: int) -> float:
    tool = mounts.tools["mcp:a:echo"]
    start = time.perf_counter()
    for _ in range(calls):
        await mounts.call(tool, {"text": "x"}, timeout_s=10)
    return (time.perf_counter() - start) / calls * 1000


def _expire(home: Path) -> None:
    index = home / "oauth" / "index.json"
    data = json.loads(index.read_text())
    for facts in data.values():
        facts["expires_at_ms"] = 0
    index.write_text(json.dumps(data))


async def _flow_us(auth: httpx2.Auth, requests: int) -> float:
    """Microseconds per request that ``auth`` takes to pass one request and see its 200 response."""
    request = httpx2.Request("POST", "http://127.0.0.1/mcp", headers={"mcp-protocol-version": "2025-11-25"})
    response = httpx2.Response(200, request=request)
    start = time.perf_counter()
    for _ in range(requests):
        flow = auth.async_auth_flow(request)
        await flow.__anext__()
        with contextlib.suppress(StopAsyncIteration):
            await flow.asend(response)
        await flow.aclose()
    return (time.perf_counter() - start) / requests * 1e6


async def bench_flow(contract: Contract, home: Path, environ: dict[str, str], rounds: int) -> tuple[float, float]:
    """Median microseconds per request: (the OAuth provider with a valid token, no auth)."""
    flows = OAuthFlows(TokenStore(home / "oauth"), SystemClock(), environ=environ)
    server = contract.mcp.servers[0]
    flows.describe(server)
    provider = flows.flow(server, lambda name, attributes: None)
    assert provider is not None
    await _flow_us(provider, 10)  # loads the stored token, as a connection's first request does
    timed: dict[str, list[float]] = {"oauth": [], "none": []}
    for _ in range(rounds):
        timed["oauth"].append(await _flow_us(provider, 2000))
        timed["none"].append(await _flow_us(httpx2.Auth(), 2000))
    return statistics.median(timed["oauth"]), statistics.median(timed["none"])


async def bench(issuer: str, url: str, calls: int, rounds: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="truss-bench-oauth-"))
    environ = {"CC_SECRET": "cc-secret-value", "BEARER": _token(issuer, url)}
    oauth, static = _contract(url, oauth=True), _contract(url, oauth=False)
    async with _mounts(oauth, home, environ):  # fetch and store a token once
        pass
    per_call: dict[str, list[float]] = {"oauth": [], "static": []}
    for _ in range(rounds):
        for name, contract in (("oauth", oauth), ("static", static)):
            async with _mounts(contract, home, environ) as mounts:
                per_call[name].append(await _per_call_ms(mounts, calls))
    connect_ms: dict[str, list[float]] = {"refresh": [], "valid": []}
    for _ in range(rounds):
        for name in ("refresh", "valid"):
            if name == "refresh":
                _expire(home)  # the client credentials grant "refreshes" by asking for a new token
            start = time.perf_counter()
            async with _mounts(oauth, home, environ):
                connect_ms[name].append((time.perf_counter() - start) * 1000)
    disk = fsync_state(home)
    o, s = statistics.median(per_call["oauth"]), statistics.median(per_call["static"])
    r, v = statistics.median(connect_ms["refresh"]), statistics.median(connect_ms["valid"])
    print(f"per call, median of {rounds} rounds x {calls} calls:")
    print(f"  OAuth, cached token      {o:8.3f} ms")
    print(f"  static bearer header     {s:8.3f} ms")
    print(f"  ratio                    {o / s:8.3f}x   (target <= 1.05x)")
    print(f"connect (and close), median of {rounds}:")
    print(f"  token must be refreshed  {r:8.1f} ms")
    print(f"  valid token              {v:8.1f} ms")
    print(f"  the refresh's share      {(r - v) / r * 100:8.1f} %  ({r - v:.1f} ms, token request + store write)")
    print(f"  disk                     {disk}")
    flow_us, none_us = await bench_flow(oauth, home, environ, rounds)
    print(f"the auth flow alone per request, median of {rounds} x 2000:")
    print(f"  OAuth, valid token       {flow_us:8.1f} us")
    print(f"  no auth (httpx's Auth)   {none_us:8.1f} us")
    print(f"  ratio                    {flow_us / none_us:8.2f}x")


def main(calls: int, rounds: int) -> None:
    process = subprocess.Popen([sys.executable, str(SERVERS)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        issuer, url = line.split()[0][3:], line.split()[1][2:]
        anyio.run(bench, issuer, url, calls, rounds)
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    main(args.calls, args.rounds)
