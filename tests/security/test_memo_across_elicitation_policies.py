"""Attack: a memoized result the server gave after an elicitation was accepted answered a call whose
contract would have declined it.

Two contracts declare the same server and tool with ``memo``, one accepting the server's elicitation
requests and one declining them. What a server answers depends on what it was told, so a result
recorded under one policy must not be replayed under the other: the elicitation policy is part of
the server's memo identity, like its credential names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.durability.support import counting_contract, invocations, make_home, truss

MEMO = '[[mcp.servers.tools]]\nname = "count"\nmemo = "1h"\n'


def _contract(directory: Path, action: str) -> Path:
    return counting_contract(
        directory,
        steps=[("mcp:cnt:count", {"key": "k"})],
        check_tool="mcp:cnt:count",
        name=f"memo-elicitation-{action}",
        server=f'{MEMO}[mcp.servers.elicitation]\naction = "{action}"\n',
    )


@pytest.mark.slow
def test_a_memoized_result_is_not_replayed_to_a_server_declared_with_another_elicitation_policy(
    tmp_path: Path,
) -> None:
    home = make_home(tmp_path / "home")
    first = truss(home, "run", str(_contract(tmp_path, "accept")), "--session", "a")
    assert first.returncode == 0, first.stdout + first.stderr
    same = truss(home, "run", str(_contract(tmp_path, "accept")), "--session", "b")
    assert same.returncode == 0, same.stdout + same.stderr
    other = truss(home, "run", str(_contract(tmp_path, "decline")), "--session", "c")
    assert other.returncode == 0, other.stdout + other.stderr
    assert invocations(tmp_path) == {"count k": 2}  # the same policy was answered from the memo, the other was not
