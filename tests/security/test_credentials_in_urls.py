"""Attack surface: a credential written into an MCP server's URL (``?access_token=``, ``?key=``,
``user:password@``). The effective contract is recorded in ``session_started`` and exported in
bundles, so the credential would be in the ledger for good. The contract is refused at load, the
error names the part of the URL but never echoes the value, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.durability.support import cli
from tests.security._support import DATA

ATTACKS = sorted((DATA / "contracts").glob("*_server_url*.toml"))


def test_every_url_attack_file_is_exercised() -> None:
    assert [p.name for p in ATTACKS] == [
        "key_in_server_url_query.toml",
        "token_in_server_url_query.toml",
        "user_info_in_server_url.toml",
    ]


@pytest.mark.parametrize("contract", ATTACKS, ids=[p.stem for p in ATTACKS])
def test_a_credential_in_a_server_url_is_refused_without_echoing_it(tmp_path: Path, contract: Path) -> None:
    home = tmp_path / "home"
    checked = cli(home, "contract", "check", str(contract))
    assert checked.returncode == 2
    assert "mcp.servers[0].url" in checked.stderr and "holds a credential" in checked.stderr
    assert "CANARY" not in checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    assert not home.exists()


def test_a_url_with_ordinary_query_parameters_still_loads(tmp_path: Path) -> None:
    text = (DATA / "contracts" / "token_in_server_url_query.toml").read_text()
    contract = tmp_path / "fine.toml"
    contract.write_text(text.replace("&access_token=CANARY-url-secret-1", "&region=eu"))
    assert cli(tmp_path / "home", "contract", "check", str(contract)).returncode == 0
