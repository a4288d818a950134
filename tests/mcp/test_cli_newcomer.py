"""Issue 15 part A for ``truss mcp``: tools you can see, pins you can review and write, errors that
name their target. Each test runs ``truss`` as a subprocess against real servers (the ``.peers``
servers, or this suite's wire-level ``raw.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import node_peer, peers_path_env, python_peer, truss_cmd
from tests.mcp._util import RAW

TIMEOUT = 90


def truss(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = peers_path_env()
    environ["TRUSS_HOME"] = str(home)
    environ.update(env or {})
    return subprocess.run(
        [*truss_cmd(), *args], check=False, capture_output=True, text=True, env=environ, timeout=TIMEOUT
    )


def raw_contract(path: Path, *, variant: str = "", params: bool = False, allow: str = '["echo", "add"]') -> Path:
    """A contract around ``raw.py``; ``variant = "louder"`` changes echo's definition."""
    env = f"env = {{ RAW_ECHO_VARIANT = {json.dumps(variant)} }}\n" if variant else ""
    param = '[contract.params.who]\ntype = "string"\n' if params else ""
    intent = "greet ${params.who}" if params else "greet"
    path.write_text(
        f"""# A contract a person wrote: these comments must survive `truss mcp pin --write`.
[contract]
name = "pins"
intent = "{intent}"
{param}
[[mcp.servers]]
name = "raw"   # the test server
command = {json.dumps(sys.executable)}
args = [{json.dumps(RAW)}, "ok"]
allow_tools = {allow}
{env}
[policy]
default = "allow"
""",
        encoding="utf-8",
    )
    return path


# -- seeing tools ---------------------------------------------------------------------------------


def test_probe_shows_each_tools_description_and_arguments_of_mcp_server_time(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--command", python_peer("mcp-server-time"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Get current time in a specific timezone" in out
    assert "arguments:" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("timezone "))
    assert "string" in line and "required" in line and "IANA timezone name" in line
    assert "read-only" in out


def test_probe_json_has_the_whole_input_and_output_schemas(truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--json", "--command", *node_peer("server-everything"))
    assert done.returncode == 0, done.stderr
    tools = {t["name"]: t for t in json.loads(done.stdout)["tools"]}
    echo = tools["echo"]
    assert echo["description"] == "Echoes back the input string" and echo["title"] == "Echo Tool"
    assert echo["input_schema"]["properties"]["message"]["type"] == "string"
    assert echo["input_schema"]["required"] == ["message"]
    structured = tools["get-structured-content"]
    assert structured["output_schema"]["type"] == "object"
    assert all("annotations" in t for t in tools.values())


def test_list_shows_descriptions_and_arguments_and_works_without_the_contracts_params(
    tmp_path: Path, truss_home: Path
) -> None:
    contract = raw_contract(tmp_path / "c.toml", params=True)
    done = truss(truss_home, "mcp", "list", str(contract))
    assert done.returncode == 0, done.stderr
    assert "Echo the text back." in done.stdout and "Add two numbers." in done.stdout
    assert any(x.split()[:3] == ["a", "number", "optional"] for x in done.stdout.splitlines())
    assert "structured output: yes" in done.stdout
    probed = truss(truss_home, "mcp", "probe", "--contract", str(contract), "raw")
    assert probed.returncode == 0, probed.stderr
    # ... while a run still needs the param.
    ran = truss(truss_home, "contract", "check", str(contract))
    assert ran.returncode == 2 and "who" in ran.stderr


def test_tool_descriptions_from_a_server_are_escaped_and_bounded(tmp_path: Path, truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--command", sys.executable, RAW, "escapes")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert all(len(line) < 400 for line in done.stdout.splitlines())


def test_an_allowlisted_tool_the_server_does_not_advertise_gets_a_did_you_mean(
    tmp_path: Path, truss_home: Path
) -> None:
    contract = raw_contract(tmp_path / "c.toml", allow='["echo", "Add", "ecoh"]')
    done = truss(truss_home, "mcp", "list", str(contract))
    assert done.returncode == 4
    assert "Did you mean 'add' for 'Add', 'echo' for 'ecoh'?" in done.stderr, done.stderr
    probed = truss(truss_home, "mcp", "probe", "--json", "--name", "raw", "--against", str(contract),
                   "--command", sys.executable, RAW, "ok")  # fmt: skip
    assert probed.returncode == 1, probed.stderr
    rows = {r["tool"]: r for r in json.loads(probed.stdout)["drift"]["tools"]}
    assert rows["ecoh"]["state"] == "missing" and rows["ecoh"]["did_you_mean"] == "echo"
    assert rows["Add"]["did_you_mean"] == "add"


# -- pins ------------------------------------------------------------------------------------------


def test_pin_prints_the_new_pins_then_writes_them_keeping_the_files_comments(tmp_path: Path, truss_home: Path) -> None:
    contract = raw_contract(tmp_path / "c.toml")
    before = contract.read_text(encoding="utf-8")
    shown = truss(truss_home, "mcp", "pin", str(contract))
    assert shown.returncode == 1, shown.stderr
    assert "+ echo  (unpinned) -> sha256:" in shown.stdout and "--write" in shown.stdout
    assert contract.read_text(encoding="utf-8") == before  # printing writes nothing
    written = truss(truss_home, "mcp", "pin", str(contract), "--write")
    assert written.returncode == 0, written.stderr
    text = contract.read_text(encoding="utf-8")
    assert text.startswith("# A contract a person wrote") and 'name = "raw"   # the test server' in text
    assert text.count("[[mcp.servers.tools]]") == 2
    listed = json.loads(truss(truss_home, "mcp", "list", str(contract), "--json").stdout)
    pins = {t["name"]: t["pin"] for t in listed["servers"][0]["tools"]}
    assert f'pin = "{pins["echo"]}"' in text and f'pin = "{pins["add"]}"' in text
    again = truss(truss_home, "mcp", "pin", str(contract))
    assert again.returncode == 0 and "every pin is current" in again.stdout


def test_a_pin_mismatch_shows_what_changed_and_pin_rewrites_the_changed_pin(tmp_path: Path, truss_home: Path) -> None:
    contract = raw_contract(tmp_path / "c.toml")
    assert truss(truss_home, "mcp", "pin", str(contract), "--write").returncode == 0
    pinned = contract.read_text(encoding="utf-8")
    # The server changes echo's definition (here: through its environment).
    louder = pinned.replace(
        'allow_tools = ["echo", "add"]', 'allow_tools = ["echo", "add"]\nenv = { RAW_ECHO_VARIANT = "louder" }'
    )
    contract.write_text(louder, encoding="utf-8")
    failed = truss(truss_home, "mcp", "list", str(contract))
    assert failed.returncode == 4
    assert "changed since the pinned definition: description, inputSchema" in failed.stderr, failed.stderr
    assert "~ description: Echo the text back. -> Echo the text back, louder." in failed.stderr
    assert "+ inputSchema/properties/volume/type: integer" in failed.stderr
    error = json.loads(truss(truss_home, "mcp", "list", str(contract), "--json").stdout)
    assert error["error"] == "PinMismatchError" and "+ inputSchema/properties/volume/type: integer" in error["changes"]
    review = truss(truss_home, "mcp", "pin", str(contract), "--json")
    assert review.returncode == 1
    (server,) = json.loads(review.stdout)["servers"]
    rows = {r["tool"]: r for r in server["tools"]}
    assert rows["echo"]["state"] == "changed" and rows["add"]["state"] == "ok"
    assert "~ description: Echo the text back. -> Echo the text back, louder." in rows["echo"]["changes"]
    assert truss(truss_home, "mcp", "pin", str(contract), "--write").returncode == 0
    assert truss(truss_home, "mcp", "list", str(contract)).returncode == 0
    assert contract.read_text(encoding="utf-8").count("[[mcp.servers.tools]]") == 2


def test_pin_against_mcp_server_time_writes_pins_a_run_then_accepts(tmp_path: Path, truss_home: Path) -> None:
    contract = tmp_path / "time.toml"
    contract.write_text(
        """[contract]
name = "time"
intent = "what time is it"
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:time:get_current_time"
arguments = { timezone = "Etc/UTC" }
[[mcp.servers]]
name = "time"
command = "mcp-server-time"
allow_tools = ["get_current_time"]
[policy]
default = "allow"
""",
        encoding="utf-8",
    )
    assert truss(truss_home, "mcp", "pin", str(contract), "--write").returncode == 0
    assert '[[mcp.servers.tools]]\nname = "get_current_time"\npin = "sha256:' in contract.read_text(encoding="utf-8")
    subprocess.run([*truss_cmd(), "init"], env={**os.environ, "TRUSS_HOME": str(truss_home)}, check=True,
                   capture_output=True, timeout=TIMEOUT)  # fmt: skip
    ran = truss(truss_home, "run", str(contract))
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_pin_refuses_a_layout_it_cannot_edit_and_leaves_the_file_alone(tmp_path: Path, truss_home: Path) -> None:
    contract = raw_contract(tmp_path / "c.toml")
    text = contract.read_text(encoding="utf-8").replace(
        "[policy]", 'tools = [{ name = "echo", pin = "sha256:' + "0" * 64 + '" }]\n[policy]'
    )
    contract.write_text(text, encoding="utf-8")
    done = truss(truss_home, "mcp", "pin", str(contract), "--write")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "inline array" in done.stderr and "Traceback" not in done.stderr
    assert contract.read_text(encoding="utf-8") == text


@pytest.mark.parametrize("flag", ["--write", ""])
def test_pin_with_an_unknown_server_is_a_usage_error(tmp_path: Path, truss_home: Path, flag: str) -> None:
    contract = raw_contract(tmp_path / "c.toml")
    done = truss(truss_home, "mcp", "pin", str(contract), "--server", "nope", *([flag] if flag else []))
    assert done.returncode == 2 and "declares no such server" in done.stderr
