"""``truss mcp list`` and ``truss mcp probe --sandbox`` show the sandbox a server gets and try it (real bwrap).

Each starts the server confined, lists its tools, and says what it tried to reach while starting.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import REPO, peers_path_env, python_peer, truss_cmd
from tests.mcp.sandbox._util import SERVERS, checked_bwrap
from truss.ledger.keys import IdentityKey

TIMEOUT = 120


def _truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**peers_path_env(), "TRUSS_HOME": str(home)}
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=TIMEOUT, check=False
    )


@pytest.fixture
def confined_contract(tmp_path: Path) -> tuple[Path, Path]:
    """A home and a contract whose ``escape`` server tries, at start-up, hosts its sandbox does not allow."""
    anyio.run(checked_bwrap)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    IdentityKey.create(home / "identity.key")
    work = tmp_path / "work"
    work.mkdir()
    config = {
        "ssh_canary": str(tmp_path / "none"),
        "identity_key": str(home / "identity.key"),
        "ledger": str(home / "ledger.db"),
        "truss_home": str(home),
        "read_dir": str(work),
        "write_dir": str(work),
        "outside_file": str(tmp_path / "outside.txt"),
        "refused_port": 9,
        "allowed_port": 7,
        "other_host": "example.com",
        "fork": 1,
        "allocate": 0,
        "big_file": 0,
        "host_pid": 1,
    }
    contract = tmp_path / "probe.toml"
    contract.write_text(
        f"""
[contract]
name = "probe"
intent = "look at a confined server"

[[mcp.servers]]
name = "escape"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(SERVERS / "escape.py"))}, {json.dumps(json.dumps(config))}]
allow_tools = ["startup_report"]
connect_timeout = "60s"
[mcp.servers.sandbox]
write = [{json.dumps(str(work))}]
network = "allow"
allow_hosts = ["127.0.0.1:7"]
limits = {{ memory = "256M", processes = 32 }}
""",
        encoding="utf-8",
    )
    return home, contract


def test_mcp_list_shows_the_sandbox_and_what_the_server_tried_to_reach_while_starting(
    confined_contract: tuple[Path, Path],
) -> None:
    home, contract = confined_contract
    listed = _truss(home, "mcp", "list", str(contract))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    out = listed.stdout
    assert "sandbox       bubblewrap" in out and "network allow to 127.0.0.1:7" in out
    assert "limits memory 256 MiB, processes 32" in out
    assert "reached       refused example.com:443 (not_allowed)" in out
    assert "reached       refused 127.0.0.1:9 (not_allowed)" in out
    assert "startup_report  mounted" in out


def test_mcp_probe_json_has_the_profile_and_the_egress_attempts(confined_contract: tuple[Path, Path]) -> None:
    home, contract = confined_contract
    probed = _truss(home, "--json", "mcp", "probe", "--contract", str(contract), "escape")
    assert probed.returncode == 0, probed.stdout + probed.stderr
    data = json.loads(probed.stdout)
    assert data["launcher"]["kind"] == "sandbox" and data["launcher"]["sandbox"]["network"] == "allow"
    refused = {(e["host"], e["port"]) for e in data["egress"] if e["decision"] == "refused"}
    assert refused == {("example.com", 443), ("127.0.0.1", 9)}
    assert {t["name"] for t in data["tools"]} == {"startup_report", "attack"}


def test_mcp_probe_sandbox_confines_a_command_that_would_run_unconfined(tmp_path: Path) -> None:
    anyio.run(checked_bwrap)
    home = tmp_path / "home"
    plain = _truss(home, "mcp", "probe", "--command", python_peer("mcp-server-time"))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "sandbox       none (plain: runs with Truss's authority)" in plain.stdout
    confined = _truss(home, "mcp", "probe", "--sandbox", "--command", python_peer("mcp-server-time"))
    assert confined.returncode == 0, confined.stdout + confined.stderr
    assert "sandbox       bubblewrap" in confined.stdout and "network none" in confined.stdout
    assert "reached       nothing through the egress proxy" in confined.stdout
    assert "get_current_time" in confined.stdout


def test_mcp_probe_sandbox_refuses_an_http_server_with_the_remote_equivalent(tmp_path: Path) -> None:
    refused = _truss(tmp_path / "home", "mcp", "probe", "--sandbox", "--url", "http://127.0.0.1:9/mcp")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "HTTP server is not a process Truss starts" in refused.stderr and "allow_hosts" in refused.stderr
    assert "Traceback" not in refused.stderr
