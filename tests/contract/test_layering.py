"""Layers: defaults <- operator config <- --agent <- contract <- --mcp-config, and the hash over the result."""

from __future__ import annotations

from pathlib import Path

import pytest

from truss import ContractError
from truss.contract import Budget, Contract, load_contract, load_contract_text

CONTRACT = """
[contract]
name = "layers"
intent = "check layering"

[budget]
max_tool_calls = 7

[[mcp.servers]]
name = "time"
allow_tools = ["get_current_time"]
"""

CONFIG = """
[budget]
max_tool_calls = 3
max_model_turns = 9
deadline = "5m"

[agent]
max_turns = 11
max_parallel_calls = 2

[policy]
default = "deny"

[[mcp.servers]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
call_timeout = "9s"

[[mcp.servers]]
name = "git"
command = "mcp-server-git"
allow_tools = ["git_reset"]
"""

AGENT = """
[agent]
max_turns = 5
system = "be brief"
"""

OVERLAY = """
[[mcp.servers]]
name = "time"
call_timeout = "2s"
env = { TZ = "UTC" }
"""


def _load(contract: str = CONTRACT, **layers: str) -> Contract:
    return load_contract_text(
        contract,
        source="contract.toml",
        config=("config.toml", layers["config"]) if "config" in layers else None,
        agent=("agent.toml", layers["agent"]) if "agent" in layers else None,
        overlay=("overlay.toml", layers["overlay"]) if "overlay" in layers else None,
    )


def test_built_in_defaults_fill_what_no_layer_sets() -> None:
    contract = _load(CONTRACT.replace('allow_tools = ["get_current_time"]', 'command = "c"\nallow_tools = ["t"]'))
    assert contract.budget.deadline == Budget().deadline
    assert contract.policy.default == "allow"


def test_operator_config_sets_defaults_the_contract_overrides() -> None:
    contract = _load(config=CONFIG)
    assert contract.budget.max_tool_calls == 7  # contract wins
    assert contract.budget.max_model_turns == 9  # config fills in
    assert contract.budget.deadline == "5m"
    assert contract.policy.default == "deny"


def test_agent_file_overrides_operator_config_and_is_overridden_by_the_contract() -> None:
    contract = _load(config=CONFIG, agent=AGENT)
    assert contract.agent.max_turns == 5
    assert contract.agent.max_parallel_calls == 2
    assert contract.agent.system == "be brief"
    overridden = _load(CONTRACT + "\n[agent]\nmax_turns = 4\n", config=CONFIG, agent=AGENT)
    assert overridden.agent.max_turns == 4


def test_servers_merge_by_name_key_by_key() -> None:
    contract = _load(config=CONFIG, overlay=OVERLAY)
    (time,) = contract.mcp.servers
    assert time.command == "mcp-server-time"  # from the operator config
    assert time.allow_tools == ["get_current_time"]  # from the contract
    assert time.call_timeout == "2s"  # the overlay refines the config's 9s
    assert time.env == {"TZ": "UTC"}


def test_operator_config_servers_apply_only_to_servers_the_contract_names() -> None:
    contract = _load(config=CONFIG)
    assert [s.name for s in contract.mcp.servers] == ["time"]


def test_overlay_may_not_add_a_server() -> None:
    with pytest.raises(ContractError) as caught:
        _load(config=CONFIG, overlay=OVERLAY.replace('"time"', '"git"'))
    assert caught.value.fields["file"] == "overlay.toml"
    assert caught.value.fields["path"] == "mcp.servers[0].name"


def test_harness_limits_from_the_operator_config_are_enforced_and_recorded() -> None:
    config = CONFIG + '\n[harness]\nallow_commands = ["mcp-server-time"]\n'
    contract = _load(config=config)
    assert contract.harness.allow_commands == ["mcp-server-time"]
    with pytest.raises(ContractError) as caught:
        _load(config=config, overlay='[[mcp.servers]]\nname = "time"\ncommand = "sh"\n')
    assert caught.value.fields["path"] == "mcp.servers[0].command"
    assert caught.value.fields["file"] == "overlay.toml"


def test_error_in_a_merged_value_is_blamed_on_the_layer_that_wrote_it() -> None:
    with pytest.raises(ContractError) as caught:
        _load(config=CONFIG.replace('call_timeout = "9s"', 'call_timeout = "9 s"'))
    assert caught.value.fields["file"] == "config.toml"
    assert caught.value.fields["path"] == "mcp.servers[0].call_timeout"
    assert caught.value.fields["line"] == 18


def test_load_contract_reads_the_operator_config_from_home(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(CONFIG)
    (tmp_path / "c.toml").write_text(CONTRACT)
    (tmp_path / "a.toml").write_text(AGENT)
    (tmp_path / "o.toml").write_text(OVERLAY)
    contract = load_contract(
        tmp_path / "c.toml", home=tmp_path, agent_file=tmp_path / "a.toml", overlay=tmp_path / "o.toml"
    )
    assert contract.mcp.servers[0].call_timeout == "2s"
    assert contract.agent.max_turns == 5


def test_hash_changes_when_any_effective_value_changes() -> None:
    base = _load(config=CONFIG).hash
    assert _load(CONTRACT.replace("max_tool_calls = 7", "max_tool_calls = 6"), config=CONFIG).hash != base
    assert _load(config=CONFIG.replace('"5m"', '"6m"')).hash != base
    assert _load(config=CONFIG, agent=AGENT).hash != base
    assert _load(config=CONFIG, overlay=OVERLAY).hash != base


def test_hash_ignores_key_order_comments_and_layout() -> None:
    reordered = """
# the same contract, written differently
[[mcp.servers]]
allow_tools = [ "get_current_time" ]   # one tool
name = "time"

[budget]
max_tool_calls = 7

[contract]
intent = "check layering"
name = "layers"
"""
    assert _load(reordered, config=CONFIG).hash == _load(config=CONFIG).hash


def test_hash_is_the_same_whether_a_default_is_written_or_left_out() -> None:
    explicit = CONTRACT + '\n[ledger]\ndurability = "power"\n'
    assert _load(explicit, config=CONFIG).hash == _load(config=CONFIG).hash


def test_hash_changes_with_param_values_but_not_with_environment_values() -> None:
    text = CONTRACT.replace(
        'intent = "check layering"',
        'intent = "check ${params.x} for ${env.WHO}"\n[contract.params]\nx = { type = "string", default = "a" }',
    )
    a = load_contract_text(text, source="c.toml", config=("config.toml", CONFIG), environ={"WHO": "ann"})
    b = load_contract_text(text, source="c.toml", config=("config.toml", CONFIG), environ={"WHO": "bob"})
    c = load_contract_text(text, source="c.toml", config=("config.toml", CONFIG), params={"x": "b"})
    assert a.hash == b.hash
    assert a.hash != c.hash
