"""Each stdio server sees only its own secrets and the SDK's default environment; secret values
never appear in errors."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.mcp._util import contract_of, raw_server
from truss._clock import SystemClock
from truss._errors import ServerStartError
from truss.mcp._procs import MARKER_ENV
from truss.mcp.client import connect

pytestmark = pytest.mark.anyio

SDK_DEFAULT = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}
ENVIRON = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent-home",
    "A_TOKEN": "value-of-a-1234",
    "B_TOKEN": "value-of-b-5678",
    "TRUSS_ONLY_SECRET": "never-passed-9999",
}


async def test_each_server_sees_only_its_own_secret_env(tmp_path: Path) -> None:
    contract = contract_of(
        raw_server("a", "env", allow=["env"], secret_env=["A_TOKEN"], env={"MODE": "alpha"}),
        raw_server("b", "env", allow=["env"], secret_env=["B_TOKEN"]),
    )
    seen: dict[str, dict[str, str]] = {}
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, environ=ENVIRON, clock=SystemClock()) as mounts:
            for name in ("a", "b"):
                result = await mounts.call(mounts.tools[f"mcp:{name}:env"], {}, timeout_s=5)
                seen[name] = result.structured
    a, b = seen["a"], seen["b"]
    assert a["A_TOKEN"] == "value-of-a-1234" and a["MODE"] == "alpha"
    assert b["B_TOKEN"] == "value-of-b-5678"
    assert "B_TOKEN" not in a and "A_TOKEN" not in b
    assert "TRUSS_ONLY_SECRET" not in a and "TRUSS_ONLY_SECRET" not in b
    # Whatever else a child has was added by its own interpreter, never taken from Truss's environment.
    extra_allowed = SDK_DEFAULT | {MARKER_ENV, "A_TOKEN", "B_TOKEN", "MODE", "LC_CTYPE"}
    assert set(a) <= extra_allowed and set(b) <= extra_allowed


async def test_missing_secret_is_a_start_error_naming_the_variable(tmp_path: Path) -> None:
    contract = contract_of(raw_server("a", "ok", secret_env=["NOT_SET_ANYWHERE"]))
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, environ=ENVIRON, clock=SystemClock()):
            pass
    assert (info.value.server, info.value.variable, info.value.cause) == ("a", "NOT_SET_ANYWHERE", "missing_secret")


async def test_secret_values_never_reach_a_start_error(tmp_path: Path) -> None:
    contract = contract_of(raw_server("a", "exit_at_start", secret_env=["A_TOKEN"]))
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, environ=ENVIRON, clock=SystemClock()):
            pass
    text = info.value.diagnostics() + json.dumps(info.value.to_json())
    assert "value-of-a-1234" not in text
