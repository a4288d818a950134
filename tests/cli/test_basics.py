"""The CLI as a user runs it: help, init, contract check/show, exit codes, and no MCP SDK on cheap commands."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, truss_cmd


def _truss(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*truss_cmd(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_help_lists_the_commands_and_exit_codes() -> None:
    done = _truss("--help")
    assert done.returncode == 0
    assert "contract" in done.stdout and "init" in done.stdout
    assert "Exit codes" in done.stdout


def test_unknown_command_is_a_usage_error_with_exit_2_and_no_traceback() -> None:
    done = _truss("no-such-command")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("truss: ")


def test_init_creates_a_private_home_and_is_idempotent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _truss("--home", str(home), "init", "--json")
    assert first.returncode == 0
    body = json.loads(first.stdout)
    assert (body["home"], body["created"]) == (str(home), True)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    again = _truss("--home", str(home), "--json", "init")
    assert again.returncode == 0
    assert json.loads(again.stdout)["created"] is False


def test_home_defaults_to_truss_home_from_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "TRUSS_HOME": str(tmp_path / "from-env")}
    done = _truss("init", env=env, cwd=tmp_path)
    assert done.returncode == 0
    assert (tmp_path / "from-env").is_dir()


def test_home_defaults_to_dot_truss_in_the_current_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRUSS_HOME"}
    done = _truss("init", env=env, cwd=tmp_path)
    assert done.returncode == 0
    assert (tmp_path / ".truss").is_dir()


def test_contract_show_json_prints_the_effective_contract_and_its_hash(truss_home: Path) -> None:
    done = _truss("--home", str(truss_home), "contract", "show", "contracts/hello.toml", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert set(body) == {"hash", "contract"}
    assert body["hash"].startswith("sha256:") and len(body["hash"]) == 71
    assert body["contract"]["contract"]["name"] == "hello"
    assert body["contract"]["param_values"] == {"target_zone": "Asia/Tokyo"}


def test_contract_show_prints_toml_that_parses_to_the_same_contract(truss_home: Path) -> None:
    as_json = json.loads(_truss("--home", str(truss_home), "--json", "contract", "show", "contracts/hello.toml").stdout)
    done = _truss("--home", str(truss_home), "contract", "show", "contracts/hello.toml")
    assert done.returncode == 0
    assert f"# hash: {as_json['hash']}" in done.stdout
    assert tomllib.loads(done.stdout) == as_json["contract"]


def test_contract_check_and_show_take_params_agent_and_overlay(tmp_path: Path, truss_home: Path) -> None:
    (tmp_path / "agent.toml").write_text("[agent]\nmax_turns = 3\n")
    (tmp_path / "overlay.toml").write_text('[[mcp.servers]]\nname = "time"\ncall_timeout = "2s"\n')
    args = ["--param", "target_zone=Europe/Oslo", "--agent", str(tmp_path / "agent.toml")]
    args += ["--mcp-config", str(tmp_path / "overlay.toml")]
    done = _truss("--home", str(truss_home), "--json", "contract", "show", "contracts/hello.toml", *args)
    assert done.returncode == 0, done.stderr
    contract = json.loads(done.stdout)["contract"]
    assert contract["param_values"] == {"target_zone": "Europe/Oslo"}
    assert contract["agent"]["max_turns"] == 3
    assert contract["mcp"]["servers"][0]["call_timeout"] == "2s"
    check = _truss("--home", str(truss_home), "contract", "check", "contracts/hello.toml", *args)
    assert check.returncode == 0
    assert check.stdout.startswith("ok: contracts/hello.toml")


def test_contract_without_a_subcommand_prints_help_and_exits_2() -> None:
    done = _truss("contract")
    assert done.returncode == 2
    assert "check" in done.stdout


def _modules_after(argv: list[str], home: Path) -> set[str]:
    code = (
        "import sys, io, contextlib\n"
        "from truss_cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        code = main({argv!r})\n"
        "    except SystemExit as exc:  # argparse's --help exits by itself\n"
        "        code = exc.code or 0\n"
        "assert code == 0, code\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "TRUSS_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_help_does_not_import_the_mcp_sdk(truss_home: Path) -> None:
    modules = _modules_after(["--help"], truss_home)
    assert "truss_cli.main" in modules
    assert not {m for m in modules if m.split(".")[0] in ("mcp", "mcp_types")}


def test_help_lists_the_commands_without_importing_any_command_module(truss_home: Path) -> None:
    modules = _modules_after(["--help"], truss_home)
    assert "truss_cli.main" in modules
    assert not {m for m in modules if m.startswith(("truss_cli.cmd_", "truss.ledger"))}
    assert not {"truss_cli._ctx", "dataclasses", "traceback"} & modules


def test_a_command_imports_its_own_module_and_no_other_command_module(truss_home: Path) -> None:
    assert _truss("--home", str(truss_home), "init").returncode == 0
    modules = _modules_after(["ledger", "verify"], truss_home)
    assert {m for m in modules if m.startswith("truss_cli.cmd_")} == {"truss_cli.cmd_ledger"}


def test_ledger_verify_of_a_store_loads_no_bundle_witness_policy_or_panel_code(truss_home: Path) -> None:
    assert _truss("--home", str(truss_home), "init").returncode == 0
    modules = _modules_after(["ledger", "verify"], truss_home)
    assert "truss.ledger.audit" in modules
    lazy = {"truss.ledger.bundle", "truss.ledger.witnessed", "truss.ledger.tlog_policy", "truss._claims"}
    assert not (lazy | {"truss_cli._panel_view", "tempfile", "traceback"}) & modules


_HEAVY = ("mcp", "mcp_types", "httpx2", "pydantic", "pydantic_core")


@pytest.mark.parametrize(
    "argv", [["--help"], ["ledger", "verify"], ["ledger", "list"], ["ledger", "--help"], ["sessions"]], ids=" ".join
)
def test_commands_that_read_no_contract_import_neither_pydantic_nor_the_sdk_nor_httpx2(
    truss_home: Path, argv: list[str]
) -> None:
    assert _truss("--home", str(truss_home), "init").returncode == 0
    modules = _modules_after(argv, truss_home)
    assert "truss_cli.main" in modules
    assert not {m for m in modules if m.split(".")[0] in _HEAVY}
    assert not {m for m in modules if m.startswith(("truss.contract", "truss.mcp"))}


def test_the_static_command_table_is_what_every_command_module_registers_in_order() -> None:
    import argparse
    import importlib
    import pkgutil

    import truss_cli
    from truss_cli.main import COMMANDS

    registered: list[tuple[str, str, str | None]] = []
    for info in sorted(pkgutil.iter_modules(truss_cli.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            sub = argparse.ArgumentParser(prog="truss").add_subparsers()
            module: Any = importlib.import_module(f"truss_cli.{info.name}")
            module.register(sub)
            registered.extend((a.dest, info.name, a.help) for a in sub._choices_actions)  # pyright: ignore[reportPrivateUsage]
    assert list(COMMANDS) == registered


def test_contract_check_does_not_import_the_mcp_sdk(truss_home: Path) -> None:
    modules = _modules_after(["contract", "check", "contracts/hello.toml"], truss_home)
    assert "truss.contract" in modules
    assert not {m for m in modules if m.split(".")[0] in ("mcp", "mcp_types")}


def test_python_dash_m_truss_is_the_same_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "truss", "--json", "contract", "check", "contracts/hello.toml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert json.loads(done.stdout)["ok"] is True


def test_contract_check_warns_about_a_rule_that_matches_no_allowlisted_tool_and_refuses_one_naming_no_server(
    tmp_path: Path,
) -> None:
    hello = (REPO / "contracts" / "hello.toml").read_text()
    (tmp_path / "typo.toml").write_text(hello.replace('tool = "mcp:time:*"', 'tool = "mcp:time:get_time_*"'))
    done = _truss("contract", "check", "typo.toml", cwd=tmp_path)
    assert done.returncode == 0
    assert "warning: typo.toml at policy.rules[0].tool" in done.stderr
    as_json = _truss("--json", "contract", "check", "typo.toml", cwd=tmp_path)
    assert json.loads(as_json.stdout)["warnings"][0]["path"] == "policy.rules[0].tool"
    # A server that is not declared can never be mounted (an overlay adds none): an error, not a warning.
    (tmp_path / "server.toml").write_text(hello.replace('tool = "mcp:time:*"', 'tool = "mcp:tiem:*"'))
    refused = _truss("contract", "check", "server.toml", cwd=tmp_path)
    assert refused.returncode == 2 and "policy.rules[0].tool" in refused.stderr


def test_init_with_a_non_ascii_log_name_writes_a_utf8_key_that_every_later_command_reads(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _truss("--home", str(home), "--json", "init", "--name", "münchen.example/log")
    assert done.returncode == 0, done.stderr
    key_file = Path(json.loads(done.stdout)["key"])
    assert key_file.read_bytes().startswith("PRIVATE+KEY+münchen.example/log+".encode())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert list(key_file.parent.glob("*.tmp")) == []
    shown = _truss("--home", str(home), "--json", "key", "show")
    assert shown.returncode == 0, shown.stderr
    assert "münchen.example/log+" in shown.stdout
    signed = _truss("--home", str(home), "ledger", "checkpoint")
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.startswith("münchen.example/log\n")


@pytest.mark.parametrize("name", ["log\x01.example", "log\x7f.example", "tab\tlog", "esc\x1b[31m.example/log"])
def test_init_refuses_a_log_name_no_checkpoint_origin_can_hold_and_writes_no_key(tmp_path: Path, name: str) -> None:
    home = tmp_path / "home"
    done = _truss("--home", str(home), "init", "--name", name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("truss: ") and "Traceback" not in done.stderr
    assert "\n\n" not in done.stderr.strip() and "\x1b" not in done.stderr and "\x7f" not in done.stderr
    assert "origin" in done.stderr
    assert not (home / "identity.key").exists()
    assert list(home.glob("*.tmp")) == []


def test_the_ledger_subcommand_table_is_what_the_full_ledger_parser_registers_in_order() -> None:
    import argparse

    from truss_cli import cmd_ledger

    sub = argparse.ArgumentParser(prog="truss").add_subparsers()
    cmd_ledger.register(sub)
    ledger: Any = sub.choices["ledger"]
    actions: list[Any] = ledger._actions
    commands: Any = next(iter(a for a in actions if type(a).__name__ == "_SubParsersAction"))
    registered = [(a.dest, a.help) for a in commands._choices_actions]
    assert list(cmd_ledger.SUBCOMMANDS) == registered


@pytest.mark.parametrize(
    "argv",
    [["ledger", "--help"], ["ledger", "bogus"], ["ledger"], ["ledger", "verify", "--help"], ["ledger", "keys"],
     ["ledger", "verify", "--since"], ["ledger", "why", "--help"], ["ledger", "export", "--help"]],
    ids=" ".join,
)  # fmt: skip
def test_a_ledger_subcommand_parsed_lazily_prints_and_exits_as_the_full_parser_does(
    truss_home: Path, argv: list[str]
) -> None:
    code = (
        "import sys, io, contextlib\n"
        "from truss_cli import main as m\n"
        "if sys.argv[1] == 'full': m._lazy_parser = m.build_parser\n"
        "sys.exit(m.main(sys.argv[2:]))\n"
    )
    env = {**os.environ, "TRUSS_HOME": str(truss_home)}
    runs = [
        subprocess.run([sys.executable, "-c", code, mode, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60, check=False)
        for mode in ("lazy", "full")
    ]  # fmt: skip
    lazy, full = runs
    assert (lazy.returncode, lazy.stdout, lazy.stderr) == (full.returncode, full.stdout, full.stderr)
    assert lazy.stdout or lazy.stderr


def test_ledger_verify_builds_no_other_subcommand_and_loads_only_pynacls_compiled_library(truss_home: Path) -> None:
    assert _truss("--home", str(truss_home), "init").returncode == 0
    modules = _modules_after(["ledger", "verify"], truss_home)
    other = {"truss_cli._ledger_report", "truss_cli._migrate", "truss_cli._ledger_keys", "truss_cli._ledger_otlp"}
    assert not other & modules
    assert "nacl._sodium" in modules
    assert not {"nacl.signing", "nacl.bindings", "nacl.public"} & modules


def test_ledger_verify_of_a_store_loads_no_socket_shutil_credential_rules_or_cosignature_code(truss_home: Path) -> None:
    # Each was a few milliseconds of its start-up: the lease owner's host name (now from uname), the
    # help formatter's terminal width (argparse asks shutil), the URL credential rule that only an
    # error message needs, and the cosignature merge that only a second store of a checkpoint needs.
    assert _truss("--home", str(truss_home), "init").returncode == 0
    modules = _modules_after(["ledger", "verify"], truss_home)
    assert not {"socket", "shutil", "truss._credentials", "truss.ledger.cosignature"} & modules


def test_help_is_as_wide_as_columns_says_without_shutil() -> None:
    narrow = _truss("--help", env={**os.environ, "COLUMNS": "50"})
    wide = _truss("--help", env={**os.environ, "COLUMNS": "200"})
    assert narrow.returncode == wide.returncode == 0
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 50
    assert max(len(line) for line in wide.stdout.splitlines()) > 50
