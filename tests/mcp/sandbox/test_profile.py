"""The sandbox profile: validation of each key, layering over the operator's baseline, host matching.

Pure functions over values; the cases are data files (``data/bad_tables.json``,
``data/merge_cases.json``, ``data/host_cases.json``), one entry per behaviour.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.mcp.sandbox._util import DATA
from truss._errors import ContractError
from truss.mcp.sandbox import (
    HostRule,
    Limits,
    OperatorSandbox,
    match_host,
    merge_profiles,
    parse_host_rule,
    parse_operator,
    parse_size,
    parse_table,
)

BAD = json.loads((DATA / "bad_tables.json").read_text(encoding="utf-8"))
MERGES = json.loads((DATA / "merge_cases.json").read_text(encoding="utf-8"))
HOSTS = json.loads((DATA / "host_cases.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", BAD, ids=[c["name"] for c in BAD])
def test_a_bad_sandbox_table_is_refused_at_its_key_path(case: dict[str, Any]) -> None:
    with pytest.raises(ContractError) as caught:
        parse_table(case["table"])
    assert caught.value.path == case["path"]
    assert caught.value.remedy is not None


@pytest.mark.parametrize("case", MERGES, ids=[c["name"] for c in MERGES])
def test_layering_a_contract_over_the_operator_never_loosens_it(case: dict[str, Any]) -> None:
    operator = parse_operator(case["level"], case["baseline"])
    contract = None if case["contract"] is None else parse_table(case["contract"])
    if "error_path" in case:
        with pytest.raises(ContractError) as caught:
            merge_profiles(operator, contract)
        assert caught.value.path == case["error_path"]
        return
    merged = merge_profiles(operator, contract)
    assert (None if merged is None else merged.as_json()) == case["expect"]


@pytest.mark.parametrize("case", HOSTS, ids=[f"{c['rules']}-{c['host']}:{c['port']}" for c in HOSTS])
def test_allow_hosts_match_host_and_port_exactly_or_by_subdomain(case: dict[str, Any]) -> None:
    rules = [parse_host_rule(r) for r in case["rules"]]
    assert (match_host(rules, case["host"], case["port"]) is not None) is case["allowed"]


def test_the_issue_sketch_parses_to_the_values_it_names() -> None:
    table = parse_table(
        {
            "required": True,
            "read": ["/srv/data"],
            "write": ["/srv/work"],
            "network": "allow",
            "allow_hosts": ["api.github.com:443"],
            "limits": {"memory": "512M", "processes": 64, "cpu": "120s", "file_size": "100M"},
        }
    )
    assert table.limits == Limits(memory=512 << 20, processes=64, cpu_s=120, file_size=100 << 20)
    assert table.allow_hosts == (HostRule("api.github.com", 443),)
    assert table.read == ("/srv/data",) and table.write == ("/srv/work",)


def test_an_unknown_operator_level_is_refused() -> None:
    with pytest.raises(ContractError) as caught:
        parse_operator("sometimes")
    assert caught.value.path == "harness.sandbox"


def test_an_operator_baseline_cannot_set_enabled() -> None:
    with pytest.raises(ContractError) as caught:
        parse_operator("required", {"enabled": True})
    assert caught.value.path == "harness.sandbox_profile.enabled"


def test_merging_with_no_contract_table_under_off_leaves_the_server_unconfined() -> None:
    assert merge_profiles(OperatorSandbox(), None) is None


@given(st.integers(min_value=1, max_value=1 << 28), st.sampled_from(["", "K", "M", "G", "KiB", "MiB", "GB"]))
def test_sizes_in_bytes_or_with_a_binary_unit_parse_to_bytes(number: int, unit: str) -> None:
    factor = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit[:1]]
    assert parse_size(f"{number}{unit}") == number * factor


@given(st.sampled_from(["api.github.com", "a.b.example.org", "10.1.2.3", "x-y.z"]), st.integers(1, 65535))
def test_a_host_rule_prints_back_to_what_parses_to_it(host: str, port: int) -> None:
    rule = parse_host_rule(f"{host}:{port}")
    assert parse_host_rule(str(rule)) == rule
    assert match_host([rule], host, port) == rule
