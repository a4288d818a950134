"""``truss mcp list|probe|import`` as a user runs them: a subprocess, exit codes, JSON output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import truss_cmd
from tests.mcp._util import RAW, alive

DATA = Path(__file__).resolve().parent / "data"


def truss(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    return subprocess.run([*truss_cmd(), *args], check=False, capture_output=True, text=True, env=env, timeout=timeout)


def write_contract(path: Path, *, pin: str | None = None) -> Path:
    lines = [
        "[contract]",
        'name = "cli"',
        'intent = "test"',
        "[[mcp.servers]]",
        'name = "raw"',
        f"command = {json.dumps(sys.executable)}",
        f"args = [{json.dumps(RAW)}, 'ok']",
        'allow_tools = ["echo", "add"]',
    ]
    if pin is not None:
        lines += ["[[mcp.servers.tools]]", 'name = "echo"', f'pin = "{pin}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def test_list_shows_mounted_and_filtered_tools_with_pins(tmp_path: Path, truss_home: Path) -> None:
    contract = write_contract(tmp_path / "c.toml")
    done = truss(truss_home, "mcp", "list", str(contract), "--json")
    assert done.returncode == 0, done.stderr
    (server,) = json.loads(done.stdout)["servers"]
    assert (server["name"], server["protocol_version"]) == ("raw", "2025-11-25")
    states = {t["name"]: t["mounted"] for t in server["tools"]}
    assert states["echo"] and states["add"] and not states["big"]
    assert all(t["pin"].startswith("sha256:") for t in server["tools"])
    human = truss(truss_home, "mcp", "list", str(contract))
    assert human.returncode == 0
    assert "filtered (not_allowlisted)" in human.stdout


def test_list_with_a_wrong_pin_exits_4_with_both_pins(tmp_path: Path, truss_home: Path) -> None:
    wrong = "sha256:" + "0" * 64
    done = truss(truss_home, "mcp", "list", str(write_contract(tmp_path / "c.toml", pin=wrong)), "--json")
    assert done.returncode == 4
    error = json.loads(done.stdout)
    assert (error["error"], error["server"], error["tool"]) == ("PinMismatchError", "raw", "echo")
    assert error["expected"] == wrong
    assert "Traceback" not in done.stderr


def test_probe_a_command_reports_identity_tools_and_round_trip(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--json", "--command", sys.executable, RAW, "ok")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["server_info"] == {"name": "raw-ok", "version": "1.0"}
    assert data["instructions"] == "A test server."
    assert data["round_trip_method"] == "ping" and data["round_trip_ms"] > 0
    assert {t["name"] for t in data["tools"]} == {"echo", "add", "big", "mutate", "env"}


def test_probe_against_a_contract_with_a_stale_pin_reports_drift_and_exits_1(tmp_path: Path, truss_home: Path) -> None:
    stale = "sha256:" + "1" * 64
    contract = write_contract(tmp_path / "c.toml", pin=stale)
    done = truss(truss_home, "mcp", "probe", "--json", "--contract", str(contract), "raw")
    assert done.returncode == 1, done.stderr
    drift = {d["tool"]: d for d in json.loads(done.stdout)["drift"]["tools"]}
    assert drift["echo"]["state"] == "changed" and drift["echo"]["expected"] == stale
    assert drift["add"]["state"] == "unpinned" and drift["add"]["actual"].startswith("sha256:")


def test_probe_output_carries_no_terminal_escapes_from_the_server(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--command", sys.executable, RAW, "escapes")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "raw-escapes" in done.stdout


def test_probe_without_a_target_is_bad_input(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe")
    assert done.returncode == 2
    assert "exactly one of" in done.stderr


def test_probe_of_a_missing_command_exits_4_naming_the_server(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--json", "--name", "ghost", "--command", "/nonexistent/server")
    assert done.returncode == 4
    error = json.loads(done.stdout)
    assert (error["error"], error["server"]) == ("ServerStartError", "ghost")


def test_import_turns_variables_into_secret_env_and_leaves_allow_tools_to_the_operator(
    tmp_path: Path, truss_home: Path
) -> None:
    out = tmp_path / "servers.toml"
    done = truss(truss_home, "mcp", "import", str(DATA / "claude_ok.json"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    servers = {s["name"]: s for s in tomllib.loads(out.read_text())["mcp"]["servers"]}
    assert servers["github-server"]["secret_env"] == ["GITHUB_TOKEN"]
    assert servers["github-server"]["env"] == {"LOG_LEVEL": "info"}
    assert servers["remote"]["headers"]["Authorization"] == {"secret_env": "API_TOKEN", "format": "Bearer {}"}
    assert all(s["allow_tools"] == [] for s in servers.values())


@pytest.mark.parametrize(
    "attack",
    ["literal_token_in_env.json", "literal_bearer_header.json", "token_in_url.json", "variable_in_command.json"],
)
def test_import_refuses_literal_secrets_and_writes_nothing(tmp_path: Path, truss_home: Path, attack: str) -> None:
    out = tmp_path / "servers.toml"
    done = truss(truss_home, "mcp", "import", "--json", str(DATA / "import_refused" / attack), "-o", str(out))
    assert done.returncode == 2
    assert not out.exists()
    error = json.loads(done.stdout)
    assert error["error"] == "ContractError" and error["problems"]
    secret = json.loads((DATA / "import_refused" / attack).read_text()).get("_secret", "")
    assert secret and secret not in done.stdout + done.stderr


def test_import_with_probe_allows_and_pins_only_read_only_tools(tmp_path: Path, truss_home: Path) -> None:
    config = tmp_path / "one.json"
    config.write_text(json.dumps({"mcpServers": {"raw": {"command": sys.executable, "args": [RAW, "ok"]}}}))
    done = truss(truss_home, "mcp", "import", "--probe", str(config))
    assert done.returncode == 0, done.stderr
    (server,) = tomllib.loads(done.stdout)["mcp"]["servers"]
    assert server["allow_tools"] == ["echo"]
    assert [t["name"] for t in server["tools"]] == ["echo"]


def _wait_for(predicate: Callable[[], Any], timeout_s: float) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"condition not met within {timeout_s} s")


def _marked_children(parent: int) -> list[int]:
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent and b"TRUSS_MCP_SPAWN=" in environ:
            found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_a_probe_ends_the_server_and_exits_130(truss_home: Path, signum: int) -> None:
    env = dict(os.environ, TRUSS_HOME=str(truss_home))
    command = [*truss_cmd(), "mcp", "probe", "--timeout", "60s", "--command", sys.executable, RAW, "silent"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        (server,) = _wait_for(lambda: _marked_children(process.pid), 30)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == 130
    assert "interrupted" in err
    assert not alive(server)
