"""Every bad contract in ``bad/`` is refused with exit 2, one paragraph naming file and place, no traceback.

Each data file is named after the mistake. Sibling files add layers: ``<name>.overlay.toml``
(``--mcp-config``), ``<name>.agent.toml`` (``--agent``), ``<name>.config.toml`` (the operator
config in the Truss home) and ``<name>.args`` (extra command-line arguments, one per line).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from truss_cli.main import main

from tests.conftest import truss_cmd
from truss import ContractError, InputError
from truss.contract import MAX_FILE_BYTES, load_contract

BAD = Path(__file__).parent / "bad"
LAYER_SUFFIXES = (".overlay.toml", ".agent.toml", ".config.toml")

# name -> (file that is blamed, key path, line); None where the mistake has no key path or line.
# HOME/ stands for the Truss home the test makes (the operator config lives there).
EXPECTED: dict[str, tuple[str, str | None, int | None]] = {
    "agent_file_with_budget_table": ("agent_file_with_budget_table.agent.toml", "budget", 4),
    "ambiguous_regex_set_difference": (
        "ambiguous_regex_set_difference.toml",
        "policy.rules[0].args.timezone.regex",
        8,
    ),
    "config_with_contract_table": ("HOME/config.toml", "contract", 4),
    "config_with_unknown_mcp_key": ("HOME/config.toml", "mcp.default_timeout", 3),
    "overlay_mcp_not_a_table": ("overlay_mcp_not_a_table.overlay.toml", "mcp", 2),
    "allowlist_entry_twice": ("allowlist_entry_twice.toml", "mcp.servers[0].allow_tools", 8),
    "allowlist_not_an_array": ("allowlist_not_an_array.toml", "mcp.servers[0].allow_tools", 8),
    "allowlist_star_with_others": ("allowlist_star_with_others.toml", "mcp.servers[0].allow_tools", 8),
    "bad_contract_name": ("bad_contract_name.toml", "contract.name", 2),
    "bad_server_name": ("bad_server_name.toml", "mcp.servers[0].name", 6),
    "command_not_in_allow_commands": ("command_not_in_allow_commands.toml", "mcp.servers[0].command", 7),
    "done_check_pointer_with_unknown_escape": (
        "done_check_pointer_with_unknown_escape.toml",
        "done.checks[0].pointer",
        13,
    ),
    "done_check_without_tool": ("done_check_without_tool.toml", "done.checks[0]", 5),
    "duplicate_server_names": ("duplicate_server_names.toml", "mcp.servers[1].name", 11),
    "duration_as_number": ("duration_as_number.toml", "budget.call_timeout", 6),
    "duration_with_unknown_unit": ("duration_with_unknown_unit.toml", "mcp.servers[0].call_timeout", 10),
    "duration_without_unit": ("duration_without_unit.toml", "budget.deadline", 6),
    "elicitation_content_without_accept": ("elicitation_content_without_accept.toml", "mcp.servers[0].elicitation", 11),
    "empty_allowlist": ("empty_allowlist.toml", "mcp.servers[0].allow_tools", 8),
    "env_reference_in_command": ("env_reference_in_command.toml", "mcp.servers[0].command", 7),
    "env_reference_in_policy": ("env_reference_in_policy.toml", "policy.rules[0].args.timezone.equals", 8),
    "harness_in_contract": ("harness_in_contract.toml", "harness", 5),
    "host_not_in_allow_hosts": ("host_not_in_allow_hosts.toml", "mcp.servers[0].url", 8),
    "http_server_with_command": ("http_server_with_command.toml", "mcp.servers[0]", 5),
    "integer_beyond_json_range": ("integer_beyond_json_range.toml", "agent.steps[0].arguments.n", 7),
    "integer_at_2_53": ("integer_at_2_53.toml", "agent.steps[0].arguments.n", 7),
    "step_naming_an_undeclared_server": ("step_naming_an_undeclared_server.toml", "agent.steps[0].tool", 6),
    "step_naming_a_tool_not_allowlisted": ("step_naming_a_tool_not_allowlisted.toml", "agent.steps[0].tool", 6),
    "done_check_naming_a_tool_not_allowlisted": (
        "done_check_naming_a_tool_not_allowlisted.toml",
        "done.checks[0].tool",
        12,
    ),
    "done_check_naming_an_undeclared_server": (
        "done_check_naming_an_undeclared_server.toml",
        "done.checks[0].tool",
        12,
    ),
    "double_printing_as_digits_beyond_2_53": (
        "double_printing_as_digits_beyond_2_53.toml",
        "policy.rules[0].args.n.max",
        8,
    ),
    "invalid_glob_in_policy_rule": ("invalid_glob_in_policy_rule.toml", "policy.rules[0].tool", 6),
    "invalid_regex_in_arg_condition": (
        "invalid_regex_in_arg_condition.toml",
        "policy.rules[0].args.timezone.regex",
        8,
    ),
    "invalid_regex_in_done_check": ("invalid_regex_in_done_check.toml", "done.checks[0].regex", 13),
    "literal_authorization_header": ("literal_authorization_header.toml", "mcp.servers[0].headers", 9),
    "literal_password_in_elicitation_content": (
        "literal_password_in_elicitation_content.toml",
        "mcp.servers[0].elicitation",
        11,
    ),
    "literal_token_in_env": ("literal_token_in_env.toml", "mcp.servers[0].env", 8),
    "literal_mysql_pwd_in_env": ("literal_mysql_pwd_in_env.toml", "mcp.servers[0].env", 8),
    "missing_allowlist": ("missing_allowlist.toml", "mcp.servers[0].allow_tools", 5),
    "missing_intent": ("missing_intent.toml", "contract.intent", 1),
    "missing_required_param": ("missing_required_param.toml", "contract.params.service", 6),
    "negative_size": ("negative_size.toml", "budget.max_result_bytes", 6),
    "not_utf8": ("not_utf8.toml", None, 3),
    "overlay_names_unknown_server": ("overlay_names_unknown_server.overlay.toml", "mcp.servers[0].name", 3),
    "overlay_with_policy_table": ("overlay_with_policy_table.overlay.toml", "policy", 5),
    "param_default_of_wrong_type": ("param_default_of_wrong_type.toml", "contract.params.replicas", 6),
    "panel_key_on_another_kind": ("panel_key_on_another_kind.toml", "done.checks[0]", 5),
    "panel_quorum_above_reviewers": ("panel_quorum_above_reviewers.toml", "done.checks[0]", 5),
    "panel_reviewer_name_used_twice": ("panel_reviewer_name_used_twice.toml", "done.checks[0]", 5),
    "panel_reviewer_with_unknown_provider": (
        "panel_reviewer_with_unknown_provider.toml",
        "done.checks[0].reviewers[0].provider",
        10,
    ),
    "panel_reviewer_without_model": ("panel_reviewer_without_model.toml", "done.checks[0].reviewers[0]", 9),
    "panel_scripted_answer_on_a_model_reviewer": (
        "panel_scripted_answer_on_a_model_reviewer.toml",
        "done.checks[0].reviewers[1]",
        13,
    ),
    "panel_scripted_reviewer_without_an_answer": (
        "panel_scripted_reviewer_without_an_answer.toml",
        "done.checks[0].reviewers[0]",
        9,
    ),
    "panel_without_reviewers": ("panel_without_reviewers.toml", "done.checks[0]", 5),
    "param_reference_in_server_args": ("param_reference_in_server_args.toml", "mcp.servers[0].args[1]", 11),
    "param_regex_with_nested_repetition": (
        "param_regex_with_nested_repetition.toml",
        "contract.params.word.regex",
        6,
    ),
    "param_value_not_declared": ("param_value_not_declared.toml", "contract.params.replica", 5),
    "param_value_of_wrong_type": ("param_value_of_wrong_type.toml", "contract.params.replicas", 6),
    "param_value_out_of_range": ("param_value_out_of_range.toml", "contract.params.replicas", 6),
    "pin_not_a_hash": ("pin_not_a_hash.toml", "mcp.servers[0].tools[0].pin", 12),
    "provider_without_model": ("provider_without_model.toml", "agent", 5),
    "retry_in_doubt_not_allowlisted": ("retry_in_doubt_not_allowlisted.toml", "mcp.servers[0].retry_in_doubt[0]", 10),
    "sandbox_baseline_sets_enabled": ("HOME/config.toml", "harness.sandbox_profile", 1),
    "sandbox_host_outside_operator_hosts": (
        "sandbox_host_outside_operator_hosts.toml",
        "mcp.servers[0].sandbox.allow_hosts[0]",
        11,
    ),
    "sandbox_host_list_of_an_operator_server_table_without_network": (
        "sandbox_host_list_of_an_operator_server_table_without_network.toml",
        "mcp.servers[0].sandbox.allow_hosts[0]",
        11,
    ),
    "sandbox_limit_above_operator": ("sandbox_limit_above_operator.toml", "mcp.servers[0].sandbox.limits.memory", 10),
    "sandbox_network_looser_than_operator": (
        "sandbox_network_looser_than_operator.toml",
        "mcp.servers[0].sandbox.network",
        10,
    ),
    "sandbox_on_http_server": ("sandbox_on_http_server.toml", "mcp.servers[0]", 5),
    "sandbox_opt_out_under_enforced": ("sandbox_opt_out_under_enforced.toml", "mcp.servers[0].sandbox.enabled", 10),
    "sandbox_relative_bind": ("sandbox_relative_bind.toml", "mcp.servers[0].sandbox.read[0]", 10),
    "sandbox_require_false_under_enforced": (
        "sandbox_require_false_under_enforced.toml",
        "mcp.servers[0].sandbox.required",
        10,
    ),
    "sandbox_size_without_number": ("sandbox_size_without_number.toml", "mcp.servers[0].sandbox.limits.memory", 10),
    "sandbox_unknown_key": ("sandbox_unknown_key.toml", "mcp.servers[0].sandbox.writable", 10),
    "sandbox_unknown_level": ("HOME/config.toml", "harness.sandbox", 2),
    "secret_header_without_placeholder": (
        "secret_header_without_placeholder.toml",
        "mcp.servers[0].headers.Authorization.format",
        9,
    ),
    "size_with_unit_suffix": ("size_with_unit_suffix.toml", "budget.max_result_bytes", 6),
    "stdio_server_without_command": ("stdio_server_without_command.toml", "mcp.servers[0]", 5),
    "step_reference_to_later_step": ("step_reference_to_later_step.toml", "agent.steps[0].arguments.timezone", 7),
    "step_tool_not_namespaced": ("step_tool_not_namespaced.toml", "agent.steps[0].tool", 6),
    "policy_rule_naming_an_undeclared_server": (
        "policy_rule_naming_an_undeclared_server.toml",
        "policy.rules[0].tool",
        6,
    ),
    "arg_condition_min_above_max": ("arg_condition_min_above_max.toml", "policy.rules[0].args.amount.min", 9),
    "arg_condition_in_empty_list": ("arg_condition_in_empty_list.toml", "policy.rules[0].args.currency.in", 9),
    "policy_rule_tool_not_namespaced": ("policy_rule_tool_not_namespaced.toml", "policy.rules[0].tool", 6),
    "toml_datetime_value": ("toml_datetime_value.toml", "agent.steps[0].arguments.when", 7),
    "toml_duplicate_key": ("toml_duplicate_key.toml", None, 7),
    "toml_syntax_error_missing_value": ("toml_syntax_error_missing_value.toml", None, 6),
    "unknown_done_check_kind": ("unknown_done_check_kind.toml", "done.checks[0].kind", 11),
    "unknown_key_in_policy_rule": ("unknown_key_in_policy_rule.toml", "policy.rules[0].because", 8),
    "unknown_key_in_server": ("unknown_key_in_server.toml", "mcp.servers[0].allowed_tools", 10),
    "unknown_key_after_multiline_values": (
        "unknown_key_after_multiline_values.toml",
        "mcp.servers[1].budget_call",
        25,
    ),
    "unknown_param_reference": ("unknown_param_reference.toml", "agent.steps[0].arguments.timezone", 10),
    "unknown_policy_effect": ("unknown_policy_effect.toml", "policy.rules[0].effect", 7),
    "unknown_provider": ("unknown_provider.toml", "agent.provider", 6),
    "unknown_top_level_key": ("unknown_top_level_key.toml", "budjet", 5),
    "unknown_transport": ("unknown_transport.toml", "mcp.servers[0].transport", 7),
    "unterminated_reference": ("unterminated_reference.toml", "contract.intent", 3),
    "wrong_type_max_tool_calls_string": ("wrong_type_max_tool_calls_string.toml", "budget.max_tool_calls", 6),
}


def _bad_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".toml") for p in BAD.glob("*.toml") if not any(p.name.endswith(s) for s in LAYER_SUFFIXES)
    )


def _layers(name: str, home: Path) -> tuple[list[str], dict[str, object]]:
    """Command-line arguments and ``load_contract`` keywords for the sibling files of ``name``."""
    argv: list[str] = []
    kwargs: dict[str, object] = {"home": home}
    if (BAD / f"{name}.overlay.toml").exists():
        argv += ["--mcp-config", f"{name}.overlay.toml"]
        kwargs["overlay"] = f"{name}.overlay.toml"
    if (BAD / f"{name}.agent.toml").exists():
        argv += ["--agent", f"{name}.agent.toml"]
        kwargs["agent_file"] = f"{name}.agent.toml"
    if (BAD / f"{name}.config.toml").exists():
        shutil.copy(BAD / f"{name}.config.toml", home / "config.toml")
    if (BAD / f"{name}.args").exists():
        extra = (BAD / f"{name}.args").read_text().split()
        argv += extra
        kwargs["param_args"] = [a for a in extra if a != "--param"]
    return argv, kwargs


def _run(argv: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_every_bad_file_has_an_expectation() -> None:
    assert _bad_names() == sorted(EXPECTED)


def _assert_one_paragraph(stderr: str, file: str) -> None:
    assert "Traceback" not in stderr
    assert "internal error" not in stderr
    text = stderr.strip()
    assert text.startswith("truss: ")
    assert "\n" not in text, "one paragraph, one line"
    assert file in text


def _expected(name: str, home: Path) -> tuple[str, str | None, int | None]:
    file, path, line = EXPECTED[name]
    return file.replace("HOME", str(home), 1) if file.startswith("HOME/") else file, path, line


def _check_cli_result(name: str, home: Path, code: int, stdout: str, stderr: str) -> None:
    assert code == 2, stderr
    assert stdout == ""
    file, path, line = _expected(name, home)
    _assert_one_paragraph(stderr, file)
    if line is not None:
        assert f"{file}:{line}" in stderr
    if path is not None:
        assert f" at {path}:" in stderr


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_contract_is_refused_by_the_cli_handler_with_exit_2_and_one_paragraph(
    name: str, truss_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole list runs through the CLI's own entry point in-process (the same parser, loader
    # and error handler); a subprocess per file would cost an interpreter start each.
    monkeypatch.chdir(BAD)
    argv, _ = _layers(name, truss_home)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(truss_home), "contract", "check", f"{name}.toml", *argv])
    _check_cli_result(name, truss_home, code, out.getvalue(), err.getvalue())


# One of each kind of mistake also goes through `truss` as a separate process, as a user runs it.
SUBPROCESS_SAMPLE = [
    "toml_syntax_error_missing_value",
    "unknown_key_in_server",
    "duration_without_unit",
    "duplicate_server_names",
    "empty_allowlist",
    "invalid_regex_in_done_check",
    "unknown_param_reference",
    "env_reference_in_command",
    "param_value_of_wrong_type",
    "overlay_names_unknown_server",
    "command_not_in_allow_commands",
    "not_utf8",
    "unknown_provider",
    "unknown_done_check_kind",
]


@pytest.mark.parametrize("name", SUBPROCESS_SAMPLE)
def test_bad_contract_is_refused_by_truss_with_exit_2_and_one_paragraph(name: str, truss_home: Path) -> None:
    argv, _ = _layers(name, truss_home)
    done = _run([*truss_cmd(), "--home", str(truss_home), "contract", "check", f"{name}.toml", *argv], cwd=BAD)
    _check_cli_result(name, truss_home, done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_contract_error_names_file_key_path_and_line(
    name: str, truss_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(BAD)
    _, kwargs = _layers(name, truss_home)
    with pytest.raises(ContractError) as caught:
        load_contract(f"{name}.toml", **kwargs)  # pyright: ignore[reportArgumentType]
    file, path, line = _expected(name, truss_home)
    assert caught.value.fields["file"] == file
    assert caught.value.fields.get("path") == path
    assert caught.value.fields.get("line") == line
    assert caught.value.remedy


def test_bad_contract_with_json_flag_prints_the_error_as_json(truss_home: Path) -> None:
    done = _run([*truss_cmd(), "--json", "contract", "check", "unknown_key_in_server.toml"], cwd=BAD)
    assert done.returncode == 2
    body = json.loads(done.stdout)
    assert body["error"] == "ContractError"
    assert body["path"] == "mcp.servers[0].allowed_tools"
    assert body["line"] == 10


def test_file_over_one_mebibyte_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "too_large.toml"
    big.write_bytes(b"# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    done = _run([*truss_cmd(), "contract", "check", "too_large.toml"], cwd=tmp_path)
    assert done.returncode == 2
    _assert_one_paragraph(done.stderr, "too_large.toml")


def test_directory_given_as_contract_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a_directory.toml").mkdir()
    done = _run([*truss_cmd(), "contract", "check", "a_directory.toml"], cwd=tmp_path)
    assert done.returncode == 2
    _assert_one_paragraph(done.stderr, "a_directory.toml")


def test_missing_contract_file_is_refused(tmp_path: Path) -> None:
    done = _run([*truss_cmd(), "contract", "show", "no_such_contract.toml"], cwd=tmp_path)
    assert done.returncode == 2
    _assert_one_paragraph(done.stderr, "no_such_contract.toml")


_PR_CAPBSET_DROP = 24  # <linux/prctl.h>
_ROOTS_READ_ANYTHING = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (<linux/capability.h>)


def _as_root_without_file_read_override() -> Callable[[], None] | None:
    """For a subprocess of root: drop, before exec, the two capabilities that let root read a file
    whatever its mode, so that the kernel refuses root a mode-0 file as it refuses everyone else.
    An ordinary user has neither capability: nothing to drop (None)."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for capability in _ROOTS_READ_ANYTHING:
            if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability})")

    return drop


def test_unreadable_contract_file_is_refused(tmp_path: Path) -> None:
    # Root reads any file whatever its mode; `truss` runs without that power, so the read fails
    # for real under root too (the suite runs as root in CI) and as an ordinary user.
    locked = tmp_path / "unreadable.toml"
    locked.write_text((BAD.parent.parent.parent / "contracts" / "hello.toml").read_text())
    locked.chmod(0)
    argv = [*truss_cmd(), "--json", "contract", "check", "unreadable.toml"]
    done = subprocess.run(
        argv,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=_as_root_without_file_read_override(),
    )
    assert done.returncode == 2, done.stdout
    body = json.loads(done.stdout)
    assert body["error"] == "ContractError"
    assert body["file"] == "unreadable.toml"


def test_pipe_given_as_contract_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "a_pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(InputError):
        load_contract(fifo)


@pytest.mark.parametrize("name", ["literal_authorization_header", "literal_token_in_env", "literal_mysql_pwd_in_env"])
def test_a_literal_credential_is_refused_without_echoing_it(
    name: str, truss_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(BAD)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--home", str(truss_home), "--json", "contract", "check", f"{name}.toml"])
    assert code == 2
    for secret in ("sk-live-0123456789abcdef", "ghp_0123456789abcdef", "CANARY"):
        assert secret not in out.getvalue() + err.getvalue()


def test_a_file_the_os_refuses_to_open_is_a_contract_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root reads any file whatever its mode, so the refusal is the OS's answer, simulated.
    locked = tmp_path / "locked.toml"
    locked.write_text('[contract]\nname = "x"\nintent = "y"\n')

    def refuse(self: Path, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ContractError) as caught:
        load_contract(locked)
    assert caught.value.fields["file"] == str(locked)
    assert "Permission denied" in caught.value.message


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("step_naming_an_undeclared_server", "mcp:time:get_current_time"),
        ("step_naming_a_tool_not_allowlisted", "mcp:time:get_current_time"),
        ("done_check_naming_an_undeclared_server", "mcp:time:get_current_time"),
        ("policy_rule_naming_an_undeclared_server", "mcp:files:write_file"),
    ],
)
def test_a_tool_reference_that_can_never_be_mounted_suggests_the_closest_declared_one(
    name: str, suggested: str
) -> None:
    with pytest.raises(ContractError) as caught:
        load_contract(BAD / f"{name}.toml")
    assert f"Did you mean {suggested!r}?" in (caught.value.remedy or "")
    assert caught.value.fields["tool"] != suggested


def test_a_tool_reference_is_checked_against_the_effective_allowlist_so_an_overlay_may_widen_it(
    tmp_path: Path,
) -> None:
    overlay = tmp_path / "overlay.toml"
    overlay.write_text('[[mcp.servers]]\nname = "time"\nallow_tools = ["*"]\n', encoding="utf-8")
    contract = load_contract(BAD / "done_check_naming_a_tool_not_allowlisted.toml", overlay=overlay)
    assert contract.mcp.servers[0].allow_tools == ["*"]
