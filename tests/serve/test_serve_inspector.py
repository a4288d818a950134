"""serve-mcp through the MCP Inspector CLI: an independent (TypeScript) client over stdio.

Needs Node 22 and the Inspector in ``.peers/node22`` (``make peers``).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.conftest import PEERS, _missing  # pyright: ignore[reportPrivateUsage]
from tests.serve.conftest import Site
from truss._json import as_dict

pytestmark = pytest.mark.slow

NODE22 = PEERS / "node22" / "node_modules"


def _inspector(site: Site, *method: str) -> subprocess.CompletedProcess[str]:
    script = NODE22 / "@modelcontextprotocol" / "inspector" / "cli" / "build" / "cli.js"
    node = NODE22 / "node" / "bin" / "node"
    if not script.exists() or not node.exists():
        _missing("the MCP Inspector CLI with Node 22 (.peers/node22)")
    env = dict(site.env)
    env["HOME"] = str(site.tmp / "inspector-home")  # the Inspector writes its settings under HOME
    env["PATH"] = f"{node.parent}{os.pathsep}{env['PATH']}"
    (site.tmp / "inspector-home").mkdir(exist_ok=True)
    return subprocess.run(
        [str(node), str(script), "--cli", *site.cmd(), "--method", *method],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    value = as_dict(json.loads(done.stdout))
    assert value is not None
    return value


def test_the_inspector_lists_exactly_the_four_tools(serve_site: Site) -> None:
    listed = _json(_inspector(serve_site, "tools/list"))
    names = sorted(t["name"] for t in listed["tools"])
    assert names == ["truss_contract_status", "truss_ledger_export", "truss_ledger_verdict", "truss_run_contract"]


def test_the_inspector_runs_a_contract_and_gets_the_verdict_as_structured_content(serve_site: Site) -> None:
    result = _json(
        _inspector(serve_site, "tools/call", "--tool-name", "truss_run_contract", "--tool-arg", "contract=hello")
    )
    assert result.get("isError") is not True
    assert result["structuredContent"]["status"] == "pass"
    assert result["structuredContent"]["verdict"]["status"] == "pass"


def test_the_inspector_sees_a_refused_contract_name_as_an_error_result(serve_site: Site) -> None:
    result = _json(
        _inspector(serve_site, "tools/call", "--tool-name", "truss_run_contract", "--tool-arg", "contract=../hello")
    )
    assert result["isError"] is True
    assert result["_meta"]["dev.truss/error"]["reason"] == "path_separator"
    assert "structuredContent" not in result
