"""``[mcp.servers.sandbox]`` and ``[harness] sandbox``: each stdio server's effective sandbox, in the hash.

The refusals (a contract loosening what the operator set, bad keys) are data files in ``bad/``
named after the mistake (``test_bad_inputs.py``); here: what the effective contract holds.
"""

from __future__ import annotations

from typing import Any

from truss.contract import Contract, load_contract_text

CONTRACT = """
[contract]
name = "confined"
intent = "check the sandbox table"

[[mcp.servers]]
name = "time"
command = "mcp-server-time"
allow_tools = ["get_current_time"]
{table}
"""


def _load(table: str = "", *, config: str | None = None, overlay: str | None = None) -> Contract:
    return load_contract_text(
        CONTRACT.format(table=table),
        source="contract.toml",
        config=("config.toml", config) if config is not None else None,
        overlay=("overlay.toml", overlay) if overlay is not None else None,
    )


def _sandbox(contract: Contract) -> dict[str, Any] | None:
    sandbox = contract.mcp.servers[0].sandbox
    return None if sandbox is None else sandbox.model_dump(mode="json", exclude_none=True)


def test_a_server_without_a_table_is_unconfined_when_the_operator_sets_no_level() -> None:
    assert _sandbox(_load()) is None


def test_a_contract_table_is_written_out_in_normal_form_in_the_effective_contract() -> None:
    sandbox = _sandbox(_load('[mcp.servers.sandbox]\nlimits = { memory = "512M", cpu = "2m" }\n'))
    assert sandbox == {
        "required": True,
        "read": [],
        "write": [],
        "network": "none",
        "limits": {"memory": 512 * 1024 * 1024, "cpu": 120},
    }


def test_the_operator_level_required_confines_every_stdio_server_with_its_baseline() -> None:
    config = '[harness]\nsandbox = "required"\n[harness.sandbox_profile]\nlimits = { processes = 64 }\n'
    sandbox = _sandbox(_load(config=config))
    assert sandbox is not None and sandbox["limits"] == {"processes": 64}


def test_a_contract_may_opt_a_server_out_under_required_and_the_opt_out_is_recorded() -> None:
    contract = _load("[mcp.servers.sandbox]\nenabled = false\n", config='[harness]\nsandbox = "required"\n')
    assert _sandbox(contract) == {"enabled": False, "read": [], "write": []}
    confined = _load(config='[harness]\nsandbox = "required"\n')
    assert contract.hash != confined.hash


def test_a_contract_may_tighten_the_operators_baseline() -> None:
    config = (
        '[harness]\nsandbox = "enforced"\n[harness.sandbox_profile]\nnetwork = "allow"\n'
        'allow_hosts = ["*.github.com:443"]\nlimits = { memory = "1G" }\n'
    )
    table = '[mcp.servers.sandbox]\nallow_hosts = ["api.github.com:443"]\nlimits = { memory = "256M" }\n'
    sandbox = _sandbox(_load(table, config=config))
    assert sandbox is not None
    assert sandbox["network"] == "allow"
    assert sandbox["allow_hosts"] == ["api.github.com:443"]
    assert sandbox["limits"] == {"memory": 256 * 1024 * 1024}


def test_the_operator_configs_own_table_for_a_server_is_a_ceiling_not_a_default() -> None:
    config = '[[mcp.servers]]\nname = "time"\n[mcp.servers.sandbox]\nlimits = { memory = "1G" }\nread = ["/srv"]\n'
    # No level: the operator's table alone confines the server; the contract's keys tighten it.
    sandbox = _sandbox(_load('[mcp.servers.sandbox]\nlimits = { memory = "128M" }\n', config=config))
    assert sandbox is not None
    assert sandbox["limits"] == {"memory": 128 * 1024 * 1024}
    assert sandbox["read"] == ["/srv"]
    assert _sandbox(_load(config=config)) is not None


def test_an_overlays_sandbox_keys_merge_into_the_contracts_table() -> None:
    overlay = '[[mcp.servers]]\nname = "time"\n[mcp.servers.sandbox]\nread = ["/srv/data"]\n'
    sandbox = _sandbox(_load('[mcp.servers.sandbox]\nnetwork = "none"\n', overlay=overlay))
    assert sandbox is not None and sandbox["read"] == ["/srv/data"]


def test_the_sandbox_is_part_of_the_contract_hash() -> None:
    plain = _load()
    confined = _load("[mcp.servers.sandbox]\n")
    wider = _load('[mcp.servers.sandbox]\nread = ["/srv/data"]\n')
    assert len({plain.hash, confined.hash, wider.hash}) == 3


def test_the_same_sandbox_written_two_ways_hashes_the_same() -> None:
    assert (
        _load('[mcp.servers.sandbox]\nlimits = { memory = "1G" }\n').hash
        == _load(f"[mcp.servers.sandbox]\nlimits = {{ memory = {1024**3} }}\nrequired = true\n").hash
    )
