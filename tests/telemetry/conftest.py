"""Fixtures for the telemetry tests: a real OTLP/HTTP receiver, a Truss home, and `truss` as a user runs it.

The receiver (``receiver.py``) needs the ``otel`` extra (``opentelemetry-proto``), which ``make
venv`` installs. A test that needs it is skipped locally when it is missing, and fails under CI
(``CI`` set), so a green CI means spans were really received and decoded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import REPO, truss_cmd
from truss.ledger.entry import StoredEntry
from truss.ledger.keys import IdentityKey

if TYPE_CHECKING:
    from tests.telemetry.receiver import Receiver

TOOLS_SERVER = REPO / "tests" / "e2e" / "servers" / "tools.py"
TIMEOUT = 90


def require_otel_extra() -> None:
    """Skip (fail under CI) when the ``otel`` extra is missing; also at a test module's top."""
    if importlib.util.find_spec("opentelemetry.proto") is None:
        message = "the otel extra is not installed: pip install -e '.[otel]' (make venv installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message, allow_module_level=True)


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    """A running OTLP/HTTP receiver on 127.0.0.1 (``receiver.endpoint``)."""
    require_otel_extra()
    from tests.telemetry.receiver import receiver

    with receiver() as running:
        yield running


def make_home(parent: Path) -> Path:
    path = parent / "home"
    path.mkdir(mode=0o700)
    IdentityKey.create(path / "identity.key")
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path)


@contextmanager
def ledger(home: Path) -> Generator[Any]:
    """The home's ledger, opened read-only (the one place these tests open a store)."""
    from truss.ledger.store import open_store
    from truss.testing import ManualClock

    with open_store(home / "ledger.db", key=None, clock=ManualClock(), create=False) as store:
        yield store


def entries(home: Path, session: str) -> list[StoredEntry]:
    with ledger(home) as store:
        return list(store.read_session(session))


def write_config(home: Path, text: str) -> None:
    (home / "config.toml").write_text(text, encoding="utf-8")


def telemetry_config(endpoint: str, extra: str = "") -> str:
    return f'[telemetry]\notlp_endpoint = "{endpoint}"\n{extra}'


def truss(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ["TRUSS_HOME"] = str(home)
    environ.update(env or {})
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=TIMEOUT, check=False
    )


def run_json(home: Path, contract: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``truss --json run CONTRACT``'s document (the run must exit 0, 1 or 3)."""
    done = truss(home, "--json", "run", str(contract), *args, env=env)
    assert done.returncode in (0, 1, 3), done.stderr
    value: Any = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value  # pyright: ignore[reportUnknownVariableType]


def tools_contract(tmp_path: Path, body: str, *, name: str = "otel", server_extra: str = "") -> Path:
    """A contract around the wire-level ``tests/e2e/servers/tools.py`` started by this interpreter."""
    text = f"""
[contract]
name = "{name}"
intent = "telemetry"
{body}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS_SERVER))}]
allow_tools = ["echo", "slow", "write", "has_env"]
connect_timeout = "30s"
{server_extra}
[done]
pass_without_checks = true  # these runs are about their spans, not their verdict
"""
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path
