"""Every way a server refuses authentication reaches the user as one explained ``auth_failed`` error.

``truss.mcp._authfail`` is the one place a 401 or 403 becomes the error: at the connect and
during a call, with static headers, with none, and for a server whose contract gives it an
``[mcp.servers.oauth]`` table. The 401 paths with static headers (none declared, a declared one
refused, an OAuth challenge, a token that stops working mid-run) are in test_cli_newcomer.py;
the OAuth flow's own stops (no login, a refresh refused) in test_oauth.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.conftest import truss_cmd
from tests.mcp._util import contract_of, http_server
from truss._clock import SystemClock
from truss._errors import ServerStartError, ToolCallError
from truss.mcp.auth import StaticHeaders
from truss.mcp.client import connect

CLOCK = SystemClock()
OAUTH_TABLE = {"grant": "client_credentials", "client_id": "cc-client", "client_secret_env": "CC_SECRET"}


def probe(home: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRUSS_HOME": str(home)}
    return subprocess.run(
        [*truss_cmd(), "mcp", "probe", "--json", "--url", url, "--timeout", "20s"],
        check=False, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_a_403_at_connect_without_declared_credentials_says_the_server_refuses_this_client(
    bad_http: str, truss_home: Path
) -> None:
    done = probe(truss_home, f"{bad_http}/status403/mcp")
    assert done.returncode == 4, done.stdout + done.stderr
    error = json.loads(done.stdout)
    assert (error["cause"], error["status"], error["retryable"]) == ("auth_failed", 403, False)
    assert "HTTP status 403: the server requires authentication" in error["message"]
    assert "The server refuses this client" in error["remedy"]
    assert "Traceback" not in done.stderr


@pytest.mark.anyio
async def test_a_call_refused_with_403_mid_run_is_an_auth_failure_with_the_status_not_a_json_rpc_error(
    tmp_path: Path, bad_http: str
) -> None:
    contract = contract_of(http_server(f"{bad_http}/forbid/mcp"))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            with pytest.raises(ToolCallError) as info:
                await mounts.call(mounts.tools["mcp:web:echo"], {}, timeout_s=10)
    error = info.value
    assert (error.cause, error.fields["status"], error.retryable) == ("auth_failed", 403, False)
    assert (
        error.message
        == "calling tool 'echo' on MCP server 'web' failed: HTTP status 403: the server requires authentication"
    )
    assert "-32603" not in json.dumps(error.to_json())


@pytest.mark.anyio
async def test_an_oauth_challenge_to_a_server_with_an_oauth_table_says_to_log_in_again(
    tmp_path: Path, bad_http: str
) -> None:
    # An embedding program that connects without the OAuth flows (StaticHeaders): the server's
    # challenge reaches the explanation itself, which knows the contract gave it an OAuth table.
    contract = contract_of(http_server(f"{bad_http}/oauth/mcp", oauth=OAUTH_TABLE))
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK, auth=StaticHeaders()):
            pass
    error = info.value
    assert (error.cause, error.fields["status"], error.fields["oauth"]) == ("auth_failed", 401, True)
    assert "refused the credentials and asks for OAuth authorization" in error.message
    remedy = error.remedy or ""
    assert "truss mcp login web" in remedy and "client_credentials grant" in remedy
    assert "secret_env" not in remedy


@pytest.mark.anyio
async def test_an_oauth_challenge_without_an_oauth_table_points_at_one_and_at_truss_mcp_login(
    tmp_path: Path, bad_http: str
) -> None:
    contract = contract_of(http_server(f"{bad_http}/oauth/mcp"))
    with anyio.fail_after(30), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    error = info.value
    assert error.cause == "auth_failed" and error.fields["oauth"] is True
    remedy = error.remedy or ""
    assert "[mcp.servers.oauth]" in remedy and "truss mcp login web" in remedy
