"""Names that end in a newline are refused, never looked up.

Python's ``$`` matches before a final newline, so ``^[a-z]+$`` accepts ``"echo\\n"``: a tool name,
a session id, a contract name or a param name with a trailing newline passed the check and was
looked up (or written into a record). Every name pattern in ``truss`` and ``cli`` ends with ``\\Z``;
the scan below keeps it so.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from truss._errors import InputError, UsageError
from truss.contract import Contract
from truss.mcp._mount import TOOL_NAME_RE
from truss.mcp._serve_core import resolve_contract
from truss.mcp._serve_tools import parse_run, parse_session
from truss.session import check_session_id

ROOT = Path(__file__).resolve().parents[2]
_RE_FUNCTIONS = {"compile", "match", "fullmatch", "search"}


def test_a_session_id_ending_in_a_newline_is_refused_by_serve_mcp() -> None:
    with pytest.raises(InputError) as caught:
        parse_session({"session": "s_1\n"})
    assert caught.value.fields["field"] == "session"


def test_a_param_name_ending_in_a_newline_is_refused_by_serve_mcp() -> None:
    with pytest.raises(InputError) as caught:
        parse_run({"contract": "hello", "params": {"zone\n": "UTC"}})
    assert caught.value.fields["reason"] == "bad_name"


def test_a_caller_session_id_ending_in_a_newline_is_refused_by_serve_mcp() -> None:
    with pytest.raises(InputError):
        parse_run({"contract": "hello", "session_id": "key-1\n"})


def test_a_contract_name_ending_in_a_newline_is_refused_as_bad_characters(tmp_path: Path) -> None:
    (tmp_path / "hello.toml").write_text("", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        resolve_contract(tmp_path, "hello\n")
    assert caught.value.fields["reason"] == "bad_characters"


def test_a_session_id_ending_in_a_newline_is_refused_by_the_run_api() -> None:
    with pytest.raises(UsageError):
        check_session_id("s_1\n")


def test_a_tool_name_ending_in_a_newline_is_not_a_valid_mcp_tool_name() -> None:
    assert TOOL_NAME_RE.match("echo")
    assert not TOOL_NAME_RE.match("echo\n")


@pytest.mark.parametrize(
    "servers",
    [
        [{"name": "fs\n", "command": "fs-server", "allow_tools": ["*"]}],
        [{"name": "fs", "command": "fs-server", "allow_tools": ["*"], "secret_env": ["TOKEN\n"]}],
    ],
    ids=["server-name", "secret-env-name"],
)
def test_a_server_or_secret_name_ending_in_a_newline_is_refused_at_load(servers: list[dict[str, Any]]) -> None:
    data = {"contract": {"name": "t", "intent": "x"}, "mcp": {"servers": servers}}
    with pytest.raises(ValueError, match="name"):
        Contract.model_validate(data)


def test_a_contract_whose_own_name_ends_in_a_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="name"):
        Contract.model_validate({"contract": {"name": "t\n", "intent": "x"}})


def _anchored_dollar_patterns() -> list[str]:
    """Every ``re`` call in the tree whose literal pattern starts with ``^`` and ends an alternative with ``$``."""
    found: list[str] = []
    for path in sorted([*(ROOT / "truss").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in _RE_FUNCTIONS or not (isinstance(node.func.value, ast.Name)):
                continue
            if node.func.value.id != "re" or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            pattern = first.value.removeprefix("(?i)")
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            if pattern.startswith("^") and "DOTALL" not in flags and (pattern.endswith("$") or "$|" in pattern):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {first.value}")
    return found


def test_no_anchored_pattern_in_the_tree_ends_with_a_dollar_that_accepts_a_final_newline() -> None:
    assert _anchored_dollar_patterns() == []
