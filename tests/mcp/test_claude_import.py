"""The Claude-style config converter on its own: names, secrets, and the TOML it writes."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from truss._errors import ContractError
from truss.contract import Contract
from truss.mcp._claude_import import ProbedTool, convert, render_toml


def servers_of(text: str) -> list[dict[str, Any]]:
    return tomllib.loads(text)["mcp"]["servers"]


def test_names_are_made_valid_and_kept_distinct() -> None:
    config = {"mcpServers": {"My Server": {"command": "a"}, "my-server": {"command": "b"}, "__x": {"command": "c"}}}
    names = [s.table["name"] for s in convert(config, source="f.json")]
    assert names == ["my-server", "my-server-2", "x"]


def test_embedded_header_variable_becomes_a_formatted_secret_header() -> None:
    config = {"mcpServers": {"r": {"url": "https://h/mcp", "headers": {"X-Key": "key=${K};v=1"}}}}
    (server,) = convert(config, source="f.json")
    assert server.table["headers"] == {"X-Key": {"secret_env": "K", "format": "key={};v=1"}}


def test_secret_under_another_name_is_refused() -> None:
    config = {"mcpServers": {"gh": {"command": "x", "env": {"TOKEN": "${MY_TOKEN}"}}}}
    with pytest.raises(ContractError) as info:
        convert(config, source="f.json")
    assert info.value.problems == [
        "mcpServers.gh.env.TOKEN: ${MY_TOKEN} under another name; Truss passes a secret under its own "
        "name, so export TOKEN instead"
    ]


def test_not_a_claude_config_is_a_contract_error() -> None:
    with pytest.raises(ContractError) as info:
        convert([1, 2], source="f.json")
    assert info.value.path == "mcpServers"


def test_rendered_toml_with_probed_tools_loads_as_a_valid_contract() -> None:
    (server,) = convert({"mcpServers": {"fs": {"command": "fs-server", "args": ["/srv"]}}}, source="f.json")
    server.tools = [
        ProbedTool("read_file", "sha256:" + "a" * 64, read_only=True, destructive=False),
        ProbedTool("write_file", "sha256:" + "b" * 64, read_only=False, destructive=True),
    ]
    text = render_toml([server], source="f.json")
    (table,) = servers_of(text)
    assert table["allow_tools"] == ["read_file"]
    assert table["tools"] == [{"name": "read_file", "pin": "sha256:" + "a" * 64}]
    assert '# "write_file",' in text
    Contract.model_validate({"contract": {"name": "x", "intent": "y"}, "mcp": {"servers": [table]}})


def test_without_a_probe_the_allowlist_is_left_empty_and_the_contract_refuses_it() -> None:
    (server,) = convert({"mcpServers": {"fs": {"command": "fs-server"}}}, source="f.json")
    (table,) = servers_of(render_toml([server], source="f.json"))
    assert table["allow_tools"] == []
    with pytest.raises(ValueError, match="allow_tools is empty"):
        Contract.model_validate({"contract": {"name": "x", "intent": "y"}, "mcp": {"servers": [table]}})


def test_a_long_filesystem_path_in_args_is_not_taken_for_a_secret() -> None:
    path = "/tmp/pytest-of-someone/pytest-276/test_import_with_probe_makes_a0/repo"
    (server,) = convert({"mcpServers": {"git": {"command": "mcp-server-git", "args": ["--repository", path]}}},
                        source="f.json")  # fmt: skip
    assert server.table["args"] == ["--repository", path]
    with pytest.raises(ContractError, match="looks like a secret"):
        convert({"mcpServers": {"x": {"command": "x", "args": ["ghp_abcdefghijklmnopqrstuvwxyz0123456789"]}}},
                source="f.json")  # fmt: skip


def test_one_password_taken_out_of_two_urls_of_one_client_names_its_variable_once() -> None:
    args = ["postgresql://app:same@db1/a", "postgresql://app:same@db2/b"]
    (server,) = convert({"mcpServers": {"pg": {"command": "mcp-server-postgres", "args": args}}}, source="f.json")
    assert server.table["args"] == ["postgresql://app@db1/a", "postgresql://app@db2/b"]
    assert server.table["secret_env"] == ["PGPASSWORD"]


def test_two_different_passwords_for_one_variable_are_refused_not_folded_into_one() -> None:
    # Regression: both became secret_env = ["PGPASSWORD"], and one of the two passwords was lost.
    args = ["postgresql://app:pw-one-1@db1/a", "postgresql://app:pw-two-2@db2/b"]
    with pytest.raises(ContractError) as info:
        convert({"mcpServers": {"pg": {"command": "mcp-server-postgres", "args": args}}}, source="f.json")
    [problem] = info.value.problems
    assert "mcpServers.pg.args[0]" in problem and "mcpServers.pg.args[1]" in problem
    assert "pw-one-1" not in problem and "pw-two-2" not in problem


def test_a_password_moved_into_a_variable_of_a_literal_env_value_is_refused() -> None:
    entry = {"command": "mcp-server-mysql", "args": ["mysql://app:pw@db/a"], "env": {"MYSQL_PWD": "other"}}
    with pytest.raises(ContractError) as info:
        convert({"mcpServers": {"my": entry}}, source="f.json")
    assert any("mcpServers.my.env.MYSQL_PWD" in p for p in info.value.problems)
