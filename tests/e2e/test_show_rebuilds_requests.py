"""``truss ledger show`` prints each model turn's whole request, folded from the recorded deltas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_run_cli import tools_contract, truss
from truss.ledger.keys import IdentityKey


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    IdentityKey.create(path / "identity.key")
    return path


BODY = """
[agent]
final = "done"
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "first" }
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "second" }
"""


def test_ledger_show_gives_every_turn_its_whole_request_also_from_a_later_seq(tmp_path: Path, home: Path) -> None:
    run = truss(home, "run", str(tools_contract(tmp_path, BODY)), "--session", "show-me")
    assert run.returncode == 0, run.stdout + run.stderr
    shown = truss(home, "ledger", "show", "show-me", "--json")
    assert shown.returncode == 0, shown.stderr
    turns = [e for e in json.loads(shown.stdout)["entries"] if e["kind"] == "model_turn"]
    assert [len(t["request"]["messages"]) for t in turns] == [1, 3, 5]
    assert turns[0]["request"]["messages"][0] == {"role": "user", "text": "end to end"}
    assert all(t["request"]["tools"] and t["request"]["system"] for t in turns)
    last_texts = [m.get("text") for m in turns[2]["request"]["messages"] if m["role"] == "tool"]
    assert last_texts == ["first", "second"]

    later = truss(home, "ledger", "show", "show-me", "--json", "--from-seq", str(turns[2]["seq"]))
    assert later.returncode == 0, later.stderr
    [only] = [e for e in json.loads(later.stdout)["entries"] if e["kind"] == "model_turn"]
    assert only["request"] == turns[2]["request"]

    full = truss(home, "ledger", "show", "show-me", "--full")
    assert full.returncode == 0 and full.stdout.count("request of turn") == 3, full.stdout

    assert truss(home, "ledger", "erase", "show-me", "--payloads").returncode == 0
    erased = truss(home, "ledger", "show", "show-me", "--json")
    assert erased.returncode == 0, erased.stderr
    assert all(e["request"] is None for e in json.loads(erased.stdout)["entries"] if e["kind"] == "model_turn")
