"""Fixtures of the MCP tier tests: the loopback HTTP servers (each a subprocess on 127.0.0.1)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO

import pytest

from tests.conftest import node_peer
from tests.mcp._util import SERVERS


def _read_marker(stream: IO[bytes], prefix: str, timeout_s: float) -> str:
    """The value after ``prefix`` on the first line that has it, waiting at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        buffer += chunk
        for line in buffer.decode(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
    raise AssertionError(f"no {prefix} line within {timeout_s} s: {buffer[-500:]!r}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture
def bad_http() -> Iterator[str]:
    """Base URL of ``servers/http_bad.py``."""
    process = subprocess.Popen([sys.executable, str(SERVERS / "http_bad.py")], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        port = _read_marker(process.stdout, "PORT=", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process)


@pytest.fixture
def everything_http() -> Iterator[str]:
    """URL of server-everything's Streamable HTTP endpoint, bound to 127.0.0.1 by the shim."""
    node, script = node_peer("server-everything")
    env = dict(os.environ, PORT="0", NODE_OPTIONS=f"--require {SERVERS / 'loopback_shim.js'}")
    process = subprocess.Popen([node, script, "streamableHttp"], stderr=subprocess.PIPE, env=env)
    try:
        assert process.stderr is not None
        port = _read_marker(process.stderr, "TRUSS_LISTEN_PORT=", 30)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop(process)


@pytest.fixture
def modern_http() -> Iterator[str]:
    """URL of ``servers/http_modern.py`` (an SDK 2.x server), token ``modern-token``."""
    process = subprocess.Popen(
        [sys.executable, str(SERVERS / "http_modern.py"), "modern-token"], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        port = _read_marker(process.stdout, "PORT=", 30)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop(process)
