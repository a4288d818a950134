"""Fixtures for serve-mcp: a Truss home with a key, a contracts directory, and servers to talk to.

``serve_site`` builds the home (identity key, empty ledger) and a contracts directory holding
``hello`` (mcp-server-time, from ``contracts/``), ``gated`` (a run that waits for a flag file,
so tests can hold it mid-call) and ``asks`` (a run that suspends until ``truss approve``).
``HttpServer`` starts ``truss serve-mcp --transport http`` as a subprocess on 127.0.0.1 with a
free port and two principals' tokens.
"""

from __future__ import annotations

import hashlib
import json
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import REPO, peers_path_env, python_peer, truss_cmd
from truss._json import as_dict
from truss.ledger.keys import IdentityKey
from truss.mcp.server import ERROR_META

HERE = Path(__file__).resolve().parent
TOKEN_A = "token-for-alice-0123456789"
TOKEN_B = "token-for-bob-9876543210"


@dataclass
class Site:
    home: Path
    contracts: Path
    env: dict[str, str]
    tokens: Path
    tmp: Path

    def cmd(self, *extra: str) -> list[str]:
        return [*truss_cmd(), "--home", str(self.home), "serve-mcp", "--contracts-dir", str(self.contracts), *extra]

    def flag(self, name: str) -> Path:
        return self.tmp / "flags" / name


@pytest.fixture
def serve_site(tmp_path: Path) -> Site:
    python_peer("mcp-server-time")  # skips (or fails under CI) when the peers are missing
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "logs").mkdir()
    IdentityKey.create(home / "identity.key")
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    shutil.copy(REPO / "contracts" / "hello.toml", contracts / "hello.toml")
    gated = (HERE / "contracts" / "gated.toml").read_text(encoding="utf-8")
    gated = gated.replace("GATE_PYTHON", sys.executable.replace("\\", "/"))
    gated = gated.replace("GATE_SCRIPT", str(HERE / "servers" / "gate_server.py").replace("\\", "/"))
    (contracts / "gated.toml").write_text(gated, encoding="utf-8")
    shutil.copy(HERE / "contracts" / "asks.toml", contracts / "asks.toml")
    (tmp_path / "flags").mkdir()
    tokens = tmp_path / "tokens.toml"
    entries = [
        f'[[tokens]]\nhash = "sha256:{hashlib.sha256(token.encode()).hexdigest()}"\ntenant = "acme"\nuser = "{user}"\n'
        for token, user in ((TOKEN_A, "alice"), (TOKEN_B, "bob"))
    ]
    tokens.write_text("".join(entries), encoding="utf-8")
    tokens.chmod(0o600)
    env = peers_path_env()
    env.pop("TRUSS_HOME", None)
    return Site(home=home, contracts=contracts, env=env, tokens=tokens, tmp=tmp_path)


@asynccontextmanager
async def stdio_client_for(site: Site, *extra: str, mode: str = "auto") -> AsyncGenerator[Client]:
    """The SDK client talking to ``truss serve-mcp`` over stdio (its stderr goes to a log file)."""
    cmd = site.cmd(*extra)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=site.env)
    with (site.tmp / "serve-stdio.stderr.log").open("a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=60, cache=None) as c:  # pyright: ignore[reportArgumentType]
            yield c


class HttpServer:
    """``truss serve-mcp --transport http`` on 127.0.0.1, a free port; stderr kept for inspection."""

    def __init__(self, site: Site, *extra: str) -> None:
        self.proc = subprocess.Popen(
            site.cmd("--transport", "http", "--port", "0", *extra),
            env=site.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._url: queue.Queue[str] = queue.Queue()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        try:
            self.url = self._url.get(timeout=60)  # start-up imports the SDK and uvicorn: slow on a loaded machine
        except queue.Empty:
            self.stop()
            raise AssertionError("serve-mcp did not start: " + "".join(self.lines)) from None

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)
            marker = "listening on "
            if marker in line:
                self._url.put(line.split(marker, 1)[1].strip())

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        stdout = ""
        if self.proc.stdout is not None:
            stdout = self.proc.stdout.read()
            self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode, stdout


@pytest.fixture
def http_server(serve_site: Site) -> Iterator[HttpServer]:
    server = HttpServer(serve_site, "--tokens", str(serve_site.tokens), "--max-concurrent-runs", "4")
    try:
        yield server
    finally:
        server.stop()


def text_of(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block.text, str)
    return block.text


class RawStdio:
    """``truss serve-mcp`` over stdio spoken to line by line (JSON-RPC as text), stderr to a file."""

    def __init__(self, site: Site, name: str) -> None:
        self.stderr_path = site.tmp / f"{name}.stderr.log"
        self._stderr = self.stderr_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            site.cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=site.env
        )
        self.replies: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.replies.put(line)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def reply(self, timeout: float = 90) -> dict[str, Any]:
        value = as_dict(json.loads(self.replies.get(timeout=timeout)))  # every stdout line is a JSON-RPC message
        assert value is not None
        return value

    def initialize(self) -> None:
        client = {"name": "t", "version": "1"}
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}) + "\n")
        assert self.reply()["id"] == 0
        self.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")

    def close(self) -> tuple[int, str]:
        """Wait for the process (bounded), then return its exit code and stderr."""
        try:
            code = self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self._reader.join(timeout=10)
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
            self._stderr.close()
        return code, self.stderr_path.read_text(encoding="utf-8")


def call_line(request_id: int, tool: str, arguments: dict[str, Any]) -> str:
    params = {"name": tool, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}) + "\n"


def error_of(result: Any) -> dict[str, Any]:
    """The machine-readable error of an ``isError`` answer (in ``_meta``; no structuredContent)."""
    assert result.is_error, result
    assert result.structured_content is None
    meta: dict[str, Any] = result.meta or {}
    value = as_dict(meta.get(ERROR_META))
    assert value is not None, result
    return value


def structured(result: Any) -> dict[str, Any]:
    value = as_dict(result.structured_content)
    assert value is not None, result
    return value
