"""The shipped example ``contracts/reviewed-time.toml`` runs against mcp-server-time and replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, peers_path_env, python_peer
from tests.durability.support import make_home, truss


@pytest.mark.peers
def test_the_reviewed_time_example_passes_with_two_of_three_reviewers_and_replays(tmp_path: Path) -> None:
    python_peer("mcp-server-time")
    home = make_home(tmp_path / "home")
    env = {"PATH": peers_path_env()["PATH"]}
    ran = truss(home, "run", str(REPO / "contracts" / "reviewed-time.toml"), "--session", "t1", "--json", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    verdict = json.loads(ran.stdout)["verdict"]
    panel = verdict["checks"][1]["panel"]
    assert (panel["outcome"], panel["approvals"]) == ("approved", 2)
    assert [c["cites"] for c in panel["claims"]] == [["c1.0"], ["c2.0"]]
    assert "Asia/Tokyo" in panel["claims"][1]["text"]
    replay = truss(home, "replay", "t1", "--json", env={"PATH": ""})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["reviews"] == 3
