"""``truss serve-mcp`` refuses unusable options at once: exit 2, one paragraph, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import truss_cmd
from truss.ledger.keys import IdentityKey

CASES = {
    "http_without_tokens": ["--transport", "http"],
    "no_auth_on_a_public_address": ["--transport", "http", "--unsafe-no-auth", "--host", "0.0.0.0"],
    "tokens_on_stdio": ["--tokens", "TOKENS"],
    "plain_token_in_tokens_file": ["--transport", "http", "--tokens", "PLAIN"],
    "missing_contracts_dir": ["--contracts-dir", "/nonexistent-contracts-dir"],
    "zero_concurrent_runs": ["--max-concurrent-runs", "0"],
    "principal_with_a_path": ["--principal-user", "../root"],
    "port_out_of_range": ["--transport", "http", "--tokens", "TOKENS", "--port", "70000"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unusable_option_exits_2_with_one_paragraph(tmp_path: Path, case: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    IdentityKey.create(home / "identity.key")
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\nhash = "sha256:' + "a" * 64 + '"\ntenant = "t"\nuser = "u"\n')
    tokens.chmod(0o600)
    plain = tmp_path / "plain.toml"
    plain.write_text('[[tokens]]\nhash = "my-secret-token"\ntenant = "t"\nuser = "u"\n')
    plain.chmod(0o600)
    args = [{"TOKENS": str(tokens), "PLAIN": str(plain)}.get(a, a) for a in CASES[case]]
    if "--contracts-dir" not in args:
        args = ["--contracts-dir", str(contracts), *args]
    done = subprocess.run(
        [*truss_cmd(), "--home", str(home), "serve-mcp", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert "my-secret-token" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_home_without_an_identity_key_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [*truss_cmd(), "--home", str(tmp_path / "empty"), "serve-mcp", "--contracts-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
