"""Attack: one principal delegates a contract whose MCP server is hostile (a catastrophic regex in
its ``outputSchema``). The SDK's check ran on serve-mcp's event loop and stalled the whole server:
another principal's status call got no answer in 15 s. Now the check runs bounded and off the
loop, so the other principal is answered at once, and the hostile run itself ends with a verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.serve.conftest import TOKEN_A, TOKEN_B, HttpServer, Site, error_of, structured
from tests.serve.test_serve_http import http_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECURITY = Path(__file__).resolve().parent.parent / "security"
ANSWERS = SECURITY / "servers" / "answers.py"
ATTACK = SECURITY / "data" / "servers" / "catastrophic_regex_in_output_schema_pattern.json"


def _hostile_contract(site: Site, mark: Path) -> None:
    args = json.dumps([str(ANSWERS), str(ATTACK), str(mark)])
    (site.contracts / "hostile.toml").write_text(
        f"""
[contract]
name = "hostile"
intent = "Echo through a hostile server."
[[agent.steps]]
tool = "mcp:hostile:echo"
arguments = {{ text = "hi" }}
[budget]
deadline = "2m"
call_timeout = "60s"
[[mcp.servers]]
name = "hostile"
command = {json.dumps(sys.executable)}
args = {args}
allow_tools = ["echo"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:hostile:echo"
""",
        encoding="utf-8",
    )


async def _until_exists(path: Path) -> None:
    while not await anyio.Path(path).exists():  # noqa: ASYNC110 - the hostile server's only signal is this file
        await anyio.sleep(0.05)


async def test_a_hostile_servers_run_does_not_delay_another_principals_answers(serve_site: Site) -> None:
    mark = serve_site.tmp / "hostile-called"
    _hostile_contract(serve_site, mark)
    server = HttpServer(serve_site, "--tokens", str(serve_site.tokens))
    try:
        with anyio.fail_after(60):
            async with http_client(server.url, TOKEN_A) as alice:
                arguments = {"contract": "hostile", "async": True}
                session = structured(await alice.call_tool("truss_run_contract", arguments))["session"]
                await _until_exists(mark)  # the server is answering: the SDK would now check on the loop
        # Bob's answers must not wait for Alice's run (before the fix: none within 15 s).
        with anyio.fail_after(15):
            async with http_client(server.url, TOKEN_B) as bob:
                refused = error_of(await bob.call_tool("truss_contract_status", {"session": session}))
                assert refused["kind"] == "not_found"  # Bob may not see Alice's session: answered all the same
                assert len((await bob.list_tools()).tools) == 4
        with anyio.fail_after(60):
            async with http_client(server.url, TOKEN_A) as alice:
                while True:
                    status = structured(await alice.call_tool("truss_contract_status", {"session": session}))
                    if not status["running"]:
                        break
                    await anyio.sleep(0.1)
        assert status["status"] == "error"  # the call failed as invalid_result, so tool_succeeded failed
        assert status["verification"]["ok"] is True
    finally:
        server.stop()
