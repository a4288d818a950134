"""``policy.lint``: valid policies that will not do what they say are reported with their key path."""

from __future__ import annotations

from typing import Any

from truss.policy import lint

from ._support import contract_of

SERVERS: list[dict[str, Any]] = [
    {"name": "fs", "command": "fs-server", "allow_tools": ["read", "write"]},
    {"name": "git", "command": "git-server", "allow_tools": ["git_status"]},
]


def _paths(rules: list[dict[str, Any]], servers: list[dict[str, Any]] | None = None) -> list[str]:
    return [f.path for f in lint(contract_of({"rules": rules}, servers or SERVERS))]


def test_a_sound_policy_has_no_findings() -> None:
    rules = [
        {"tool": "mcp:fs:write", "effect": "ask"},
        {"tool": "mcp:fs:*", "effect": "deny", "args": {"path": {"not_glob": "/srv/**", "regex": "(?>[a-z]+/)*"}}},
        {"tool": "mcp:fs:*", "effect": "allow"},
        {"tool": "mcp:git:*", "effect": "allow"},
    ]
    assert _paths(rules) == []


def test_a_regex_that_nests_repetition_is_reported_at_its_key_path() -> None:
    rules = [{"tool": "*", "effect": "deny", "args": {"path": {"regex": "(?:[a-z]+/)*"}}}]
    assert _paths(rules) == ["policy.rules[0].args.path.regex"]


def test_a_regex_that_nests_repetition_inside_each_is_reported_at_its_key_path() -> None:
    rules = [{"tool": "*", "effect": "allow", "args": {"paths": {"each": {"regex": "(a|aa)*"}}}}]
    assert _paths(rules) == ["policy.rules[0].args.paths.each.regex"]


def test_a_rule_behind_an_unconditional_rule_that_covers_its_tools_is_reported() -> None:
    rules = [
        {"tool": "mcp:fs:*", "effect": "allow"},
        {"tool": "mcp:fs:write", "effect": "deny"},
        {"tool": "mcp:git:*", "effect": "deny"},
    ]
    assert _paths(rules) == ["policy.rules[1]"]


def test_a_rule_behind_a_conditional_rule_is_not_reported() -> None:
    rules = [
        {"tool": "mcp:fs:*", "effect": "allow", "args": {"path": {"glob": "/srv/*"}}},
        {"tool": "mcp:fs:write", "effect": "deny"},
    ]
    assert _paths(rules) == []


def test_a_rule_matching_no_allowlisted_tool_is_reported_unless_a_server_allowlists_everything() -> None:
    rules = [{"tool": "mcp:fs:delete", "effect": "deny"}]
    assert _paths(rules) == ["policy.rules[0].tool"]
    anything = [{**SERVERS[0], "allow_tools": ["*"]}]
    assert _paths(rules, anything) == []
