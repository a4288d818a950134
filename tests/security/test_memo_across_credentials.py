"""Attack: a memoized result fetched with one credential answered a call made with another.

Two contracts declare the same server and tool with ``memo``, but pass it different credentials
(``secret_env`` names, or a secret header). A result the server gave one identity (one account's
private data) must not be replayed to the other: the memo only answers a call whose server was
declared with the same credential names (values are never recorded, not even hashed, so a
changed value behind the same name is a documented limit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.durability.support import counting_contract, invocations, make_home, truss

MEMO = '[[mcp.servers.tools]]\nname = "count"\nmemo = "1h"\n'


def _contract(directory: Path, credential: str) -> Path:
    return counting_contract(
        directory,
        steps=[("mcp:cnt:count", {"key": "k"})],
        check_tool="mcp:cnt:count",
        name=f"memo-{credential.lower().replace('_', '-')}",
        server=f'secret_env = ["{credential}"]\n{MEMO}',
    )


@pytest.mark.slow
def test_a_memoized_result_is_not_replayed_to_a_server_declared_with_another_credential(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    env = {"ACCOUNT_A_TOKEN": "token-of-account-a", "ACCOUNT_B_TOKEN": "token-of-account-b"}
    first = truss(home, "run", str(_contract(tmp_path, "ACCOUNT_A_TOKEN")), "--session", "a", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    other = truss(home, "run", str(_contract(tmp_path, "ACCOUNT_B_TOKEN")), "--session", "b", env=env)
    assert other.returncode == 0, other.stdout + other.stderr
    assert invocations(tmp_path) == {"count k": 2}  # the second account's call reached the server
