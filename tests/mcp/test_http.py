"""Streamable HTTP: statuses at connect, secret headers, slow-drip bodies, and server-everything over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.mcp._util import contract_of, http_server
from truss._clock import SystemClock
from truss._errors import ServerStartError, ToolCallError
from truss.mcp.client import connect

pytestmark = pytest.mark.anyio

CLOCK = SystemClock()


@pytest.mark.parametrize("status", [401, 500])
async def test_http_error_status_at_connect_is_a_start_error_with_the_status(
    tmp_path: Path, bad_http: str, status: int
) -> None:
    contract = contract_of(http_server(f"{bad_http}/status{status}/mcp"))
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    assert (info.value.server, info.value.status) == ("web", status)


async def test_secret_header_is_sent_and_never_shown(tmp_path: Path, bad_http: str) -> None:
    headers = {"Authorization": {"secret_env": "WEB_TOKEN", "format": "Bearer {}"}}
    contract = contract_of(http_server(f"{bad_http}/auth/mcp?k=v", headers=headers))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, environ={"WEB_TOKEN": "right-token"}, clock=CLOCK) as m:
            result = await m.call(m.tools["mcp:web:echo"], {}, timeout_s=5)
            assert result.text == "echo"
            assert m.servers["web"].protocol_version == "2025-11-25"
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, environ={"WEB_TOKEN": "wrong-token-42"}, clock=CLOCK):
            pass
    assert info.value.status == 401
    shown = info.value.diagnostics() + json.dumps(info.value.to_json())
    assert "wrong-token-42" not in shown
    assert "k=v" not in shown


async def test_slow_drip_at_connect_fails_at_the_connect_timeout(tmp_path: Path, bad_http: str) -> None:
    contract = contract_of(http_server(f"{bad_http}/drip/mcp", connect_timeout="1s"))
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    assert (info.value.server, info.value.cause) == ("web", "timeout")


async def test_slow_drip_during_a_call_times_out_naming_server_and_tool(tmp_path: Path, bad_http: str) -> None:
    contract = contract_of(http_server(f"{bad_http}/ok/mcp", allow_tools=["echo", "slow"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as m:
            with pytest.raises(ToolCallError) as info:
                await m.call(m.tools["mcp:web:slow"], {}, timeout_s=0.5)
            assert (await m.call(m.tools["mcp:web:echo"], {}, timeout_s=5)).text == "echo"
    assert (info.value.server, info.value.tool, info.value.cause) == ("web", "slow", "timeout")


async def test_connection_refused_is_a_start_error(tmp_path: Path) -> None:
    contract = contract_of(http_server("http://127.0.0.1:9/mcp"))
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    assert (info.value.server, info.value.cause) == ("web", "transport")


@pytest.mark.peers
async def test_server_everything_over_streamable_http_with_progress(tmp_path: Path, everything_http: str) -> None:
    contract = contract_of(http_server(everything_http, allow_tools=["echo", "trigger-long-running-operation"]))
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as m:
            assert m.servers["web"].protocol_version == "2025-11-25"
            echo = await m.call(m.tools["mcp:web:echo"], {"message": "over http"}, timeout_s=10)
            long = m.tools["mcp:web:trigger-long-running-operation"]
            done = await m.call(long, {"duration": 0.3, "steps": 3}, timeout_s=10, progress=on_progress)
    assert echo.text == "Echo: over http"
    assert not done.is_error
    assert progress == [1, 2, 3]


async def test_secret_with_a_line_break_is_refused_before_any_request(tmp_path: Path) -> None:
    headers = {"Authorization": {"secret_env": "WEB_TOKEN", "format": "Bearer {}"}}
    contract = contract_of(http_server("http://127.0.0.1:9/mcp", headers=headers))
    environ = {"WEB_TOKEN": "tok\r\nX-Injected: yes"}
    with anyio.fail_after(10), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, environ=environ, clock=CLOCK):
            pass
    assert (info.value.cause, info.value.variable) == ("bad_secret", "WEB_TOKEN")
    assert "X-Injected" not in info.value.diagnostics() + json.dumps(info.value.to_json())


async def test_stateless_era_over_http_with_a_bearer_secret_and_progress(tmp_path: Path, modern_http: str) -> None:
    headers = {"Authorization": {"secret_env": "MODERN", "format": "Bearer {}"}}
    contract = contract_of(http_server(modern_http, allow_tools=["echo", "work"], headers=headers))
    seen: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, environ={"MODERN": "modern-token"}, clock=CLOCK) as m:
            assert m.servers["web"].protocol_version == "2026-07-28"
            echo = await m.call(m.tools["mcp:web:echo"], {"text": "modern"}, timeout_s=10)
            work = await m.call(m.tools["mcp:web:work"], {"steps": 2}, timeout_s=10, progress=on_progress)
    assert echo.text == "modern" and "_meta" not in echo.wire
    assert work.text == "did 2 steps"
    assert seen == [1, 2]
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, environ={"MODERN": "stale-token-7"}, clock=CLOCK):
            pass
    assert info.value.status == 401
    assert "stale-token-7" not in info.value.diagnostics() + json.dumps(info.value.to_json())
