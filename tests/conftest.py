"""Shared fixtures: the anyio backend, a fresh Truss home, and where the third-party MCP peers live.

Peers are installed by ``make peers`` into ``.peers/`` (or ``$TRUSS_PEERS``). A test that needs a
peer that is not installed is skipped locally but fails under CI (``CI`` set), so a green CI
always means the real servers ran.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# A real PostgreSQL server (postgres_server, postgres_url, postgres_urls), started on first use.
pytest_plugins = ["tests._services.postgres"]

REPO = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("TRUSS_PEERS") or REPO / ".peers")

# Every test talks to 127.0.0.1 only. httpx honours *_PROXY variables without exempting loopback,
# so a proxy set on a CI machine would take the tests' loopback requests (and the CLI's, as
# subprocesses inherit this environment) and refuse them.
for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_name, None)

# Property tests check properties, not speed: hypothesis's per-example deadline (200 ms) and its
# too-slow health check fail them on a loaded CI machine for reasons that are not theirs.
settings.register_profile("truss", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("truss")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def truss_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def _missing(what: str) -> None:
    message = f"{what} is not installed: run `make peers`"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def python_peer(command: str) -> str:
    """The absolute path of a PyPI MCP server's console script (mcp-server-time, mcp-server-git)."""
    path = PEERS / "py" / "bin" / command
    if not path.exists():
        _missing(command)
    return str(path)


def peers_path_env() -> dict[str, str]:
    """An environment whose PATH finds the Python peers by bare name (as contracts name them)."""
    env = dict(os.environ)
    env["PATH"] = f"{PEERS / 'py' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def node_peer(package: str) -> list[str]:
    """``[node, <entry script>]`` for an npm MCP server such as ``server-everything``."""
    script = PEERS / "node" / "node_modules" / "@modelcontextprotocol" / package / "dist" / "index.js"
    # The Node 22 that `make peers` installs, so a machine whose own node is too old still runs them.
    node22 = PEERS / "node22" / "node_modules" / "node" / "bin" / "node"
    node = str(node22) if node22.exists() else shutil.which("node")
    if node is None or not script.exists():
        _missing(f"@modelcontextprotocol/{package}")
    return [str(node), str(script)]


def truss_cmd() -> list[str]:
    """How tests run the CLI as a user would: a subprocess of this interpreter."""
    return [sys.executable, "-m", "truss"]
