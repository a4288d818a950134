"""Issue 15 part A for ``truss mcp``: tools you can see, pins you can review and write, errors that
name their target. Each test runs ``truss`` as a subprocess against real servers (the ``.peers``
servers, or this suite's wire-level ``raw.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
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


# -- errors that name their target ------------------------------------------------------------------


def test_a_command_that_is_not_found_is_named_with_the_path_searched(tmp_path: Path, truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--command", "truss-no-such-server", env={"PATH": "/nonexistent/bin"})
    assert done.returncode == 4
    assert "the command 'truss-no-such-server' was not found on the server's PATH (/nonexistent/bin)" in done.stderr
    relative = truss(truss_home, "mcp", "probe", "--command", "./bin/missing-server")
    assert relative.returncode == 4
    assert "the command './bin/missing-server' was not found (no file " in relative.stderr
    assert "Traceback" not in done.stderr + relative.stderr


def test_a_refused_http_connection_names_the_url_without_its_query(truss_home: Path) -> None:
    # A credential the rule knows in a server's URL is refused before any connection; an error shows
    # the rest without its query (a parameter the rule does not know may still hold a secret).
    done = truss(truss_home, "mcp", "probe", "--url", "http://127.0.0.1:9/mcp?page=2", "--timeout", "10s")
    assert done.returncode == 4
    assert "HTTP transport failed (ConnectError) reaching http://127.0.0.1:9/mcp." in done.stderr, done.stderr
    assert "page=2" not in done.stderr
    refused = truss(truss_home, "mcp", "probe", "--url", "http://127.0.0.1:9/mcp?token=CANARY-p", "--timeout", "1s")
    assert refused.returncode == 2, refused.stderr
    assert "CANARY" not in refused.stdout + refused.stderr


def test_a_404_at_a_url_without_a_path_suggests_mcp(everything_http: str, truss_home: Path) -> None:
    root = everything_http.removesuffix("/mcp")
    done = truss(truss_home, "mcp", "probe", "--url", root, "--timeout", "20s")
    assert done.returncode == 4
    assert f"HTTP status 404 at {root}" in done.stderr, done.stderr
    assert f"try {root}/mcp" in done.stderr
    assert truss(truss_home, "mcp", "probe", "--url", f"{root}/mcp", "--timeout", "20s").returncode == 0


def test_a_401_without_declared_headers_does_not_advise_secret_env(bad_http: str, truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--json", "--url", f"{bad_http}/status401/mcp")
    assert done.returncode == 4
    error = json.loads(done.stdout)
    assert (error["cause"], error["status"]) == ("auth_failed", 401)
    assert "secret_env variables" not in error["remedy"] and "declares no credentials" in error["remedy"]
    assert "oauth" not in error


def test_a_401_with_a_declared_header_names_the_variable_to_check(bad_http: str, truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--url", f"{bad_http}/auth/mcp", "--header-env",
                 "Authorization=WRONG_TOKEN:Bearer {}", env={"WRONG_TOKEN": "wrong"})  # fmt: skip
    assert done.returncode == 4
    assert "refused the credentials" in done.stderr
    assert "Check the secret_env variables the server's headers read (Authorization from WRONG_TOKEN)" in done.stderr
    assert "wrong" not in done.stderr.replace("wrong-token", "")


def test_a_401_asking_for_oauth_says_so_with_the_resource_metadata_url(bad_http: str, truss_home: Path) -> None:
    done = truss(truss_home, "mcp", "probe", "--json", "--url", f"{bad_http}/oauth/mcp")
    assert done.returncode == 4
    error = json.loads(done.stdout)
    assert error["oauth"] is True and error["cause"] == "auth_failed"
    assert error["resource_metadata"] == f"{bad_http}/.well-known/oauth-protected-resource/oauth/mcp"
    assert "asks for OAuth authorization" in error["message"]
    human = truss(truss_home, "mcp", "probe", "--url", f"{bad_http}/oauth/mcp")
    assert "asks for OAuth authorization" in human.stderr and "secret_env variables" not in human.stderr


def test_a_401_in_the_middle_of_a_run_is_recorded_as_an_auth_failure_with_the_status(
    bad_http: str, tmp_path: Path, truss_home: Path
) -> None:
    subprocess.run([*truss_cmd(), "init"], env={**os.environ, "TRUSS_HOME": str(truss_home)}, check=True,
                   capture_output=True, timeout=TIMEOUT)  # fmt: skip
    contract = tmp_path / "expire.toml"
    contract.write_text(
        f"""[contract]
name = "expire"
intent = "a token that stops working"
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:web:echo"
arguments = {{}}
[[mcp.servers]]
name = "web"
transport = "http"
url = "{bad_http}/expire/mcp"
allow_tools = ["echo"]
[policy]
default = "allow"
""",
        encoding="utf-8",
    )
    ran = truss(truss_home, "run", str(contract), "--session", "expire")
    assert "failed (auth_failed)" in ran.stderr, ran.stdout + ran.stderr
    entries = json.loads(truss(truss_home, "ledger", "show", "expire", "--json").stdout)["entries"]
    (call,) = [e for e in entries if e["kind"] == "mcp_tool_call"]
    failure = call["entry"]["body"]["failure"]
    assert failure == {"cause": "auth_failed", "retryable": False, "status": 401}
    assert "-32603" not in json.dumps(entries)


# -- truss mcp import that leads somewhere --------------------------------------------------------


def _git_repo(path: Path) -> Path:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    path.mkdir()
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=path, check=True, timeout=30)
    (path / "notes.txt").write_text("one\n")
    subprocess.run([*git, "add", "notes.txt"], cwd=path, check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "first"], cwd=path, check=True, timeout=30)
    return path


def _claude_file(tmp_path: Path, *, git: bool = False, everything: bool = False) -> Path:
    servers: dict[str, object] = {"Time": {"command": python_peer("mcp-server-time")}}
    if git:
        repo = _git_repo(tmp_path / "repo")
        servers["git"] = {"command": python_peer("mcp-server-git"), "args": ["--repository", str(repo)]}
    if everything:
        node, script = node_peer("server-everything")
        servers["everything"] = {"command": node, "args": [script]}
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def _init(home: Path) -> None:
    subprocess.run([*truss_cmd(), "init"], env={**os.environ, "TRUSS_HOME": str(home)}, check=True,
                   capture_output=True, timeout=TIMEOUT)  # fmt: skip


TIME_AGENT = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:time:get_current_time"
arguments = { timezone = "Etc/UTC" }
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:time:get_current_time"
"""


def test_import_without_probe_makes_a_skeleton_whose_suggested_probe_works(tmp_path: Path, truss_home: Path) -> None:
    out = tmp_path / "imported.toml"
    done = truss(truss_home, "mcp", "import", str(_claude_file(tmp_path)), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"truss mcp probe --contract {out} time" in done.stdout
    text = out.read_text(encoding="utf-8")
    assert 'name = "claude-desktop-config"' in text and "`truss mcp probe --contract FILE time`" in text
    # Fail closed: the empty allowlist is refused until someone decides ...
    check = truss(truss_home, "contract", "check", str(out))
    assert check.returncode == 2 and "allow_tools is empty" in check.stderr
    # ... and the probe the skeleton suggests works on it as written.
    probed = truss(truss_home, "mcp", "probe", "--contract", str(out), "time")
    assert probed.returncode == 0, probed.stderr
    assert "get_current_time" in probed.stdout and "does not load yet" in probed.stderr
    out.write_text(text.replace("allow_tools = []", 'allow_tools = ["get_current_time"]'), encoding="utf-8")
    assert truss(truss_home, "mcp", "pin", str(out), "--write").returncode == 0
    assert truss(truss_home, "contract", "check", str(out)).returncode == 0
    assert truss(truss_home, "mcp", "list", str(out)).returncode == 0


@pytest.mark.slow
def test_import_with_probe_makes_a_contract_that_checks_lists_and_runs_as_written(
    tmp_path: Path, truss_home: Path
) -> None:
    _init(truss_home)
    out = tmp_path / "imported.toml"
    claude = _claude_file(tmp_path, git=True, everything=True)
    done = truss(truss_home, "mcp", "import", "--probe", str(claude), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert truss(truss_home, "contract", "check", str(out)).returncode == 0
    listed = truss(truss_home, "mcp", "list", str(out), "--json")
    assert listed.returncode == 0, listed.stderr
    servers = {s["name"]: s for s in json.loads(listed.stdout)["servers"]}
    assert set(servers) == {"time", "git", "everything"}
    mounted = {name: {t["name"] for t in s["tools"] if t["mounted"]} for name, s in servers.items()}
    assert "get_current_time" in mounted["time"] and "git_status" in mounted["git"] and "echo" in mounted["everything"]
    assert "git_commit" not in mounted["git"]  # not read-only: written commented out, for review
    assert truss(truss_home, "mcp", "pin", str(out)).returncode == 0  # import wrote the current pins
    out.write_text(out.read_text(encoding="utf-8") + TIME_AGENT, encoding="utf-8")
    ran = truss(truss_home, "run", str(out))
    assert ran.returncode == 0, ran.stdout + ran.stderr


@pytest.mark.slow
def test_import_as_operator_config_serves_a_contract_that_allowlists_fewer_tools(
    tmp_path: Path, truss_home: Path
) -> None:
    _init(truss_home)
    config = truss_home / "config.toml"
    done = truss(truss_home, "mcp", "import", "--config", "--probe", str(_claude_file(tmp_path)), "-o", str(config))
    assert done.returncode == 0, done.stderr
    text = config.read_text(encoding="utf-8")
    (server,) = tomllib.loads(text)["mcp"]["servers"]
    assert server["name"] == "time" and "allow_tools" not in server and "tools" not in server
    assert "#   get_current_time" in text  # what it offers, as a comment
    contract = tmp_path / "time.toml"
    contract.write_text(
        '[contract]\nname = "time"\nintent = "what time is it"\n'
        '[[mcp.servers]]\nname = "time"\nallow_tools = ["get_current_time"]\n' + TIME_AGENT,
        encoding="utf-8",
    )
    assert truss(truss_home, "contract", "check", str(contract)).returncode == 0
    assert truss(truss_home, "mcp", "pin", str(contract), "--write").returncode == 0
    assert "pin = " in contract.read_text(encoding="utf-8")
    ran = truss(truss_home, "run", str(contract))
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_tool_entry_in_operator_config_outside_the_allowlist_names_config_toml(
    tmp_path: Path, truss_home: Path
) -> None:
    (truss_home / "config.toml").write_text(
        '[[mcp.servers]]\nname = "time"\ncommand = "mcp-server-time"\n'
        '[[mcp.servers.tools]]\nname = "get_current_time"\n[[mcp.servers.tools]]\nname = "convert_time"\n',
        encoding="utf-8",
    )
    contract = tmp_path / "c.toml"
    contract.write_text(
        '[contract]\nname = "c"\nintent = "x"\n[[mcp.servers]]\nname = "time"\nallow_tools = ["get_current_time"]\n',
        encoding="utf-8",
    )
    done = truss(truss_home, "contract", "check", str(contract), "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["file"] == str(truss_home / "config.toml") and error["line"] == 6
    assert error["path"] == "mcp.servers[0].tools[1]" and "'convert_time'" in error["message"]
