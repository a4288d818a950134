"""Witnessed checkpoints end to end: two real ``truss witness serve`` processes on 127.0.0.1 and a
Truss home that names them, driven with ``truss`` as a user runs it."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx2
import pytest

from tests.witness.support import (
    Witness,
    as_json,
    log_entries,
    make_home,
    make_witness,
    record_sessions,
    truss,
    write_policy,
    write_witness_config,
)
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.note import parse_note
from truss.ledger.stores import open_store
from truss.ledger.witness import AddCheckpoint, format_add_checkpoint

pytestmark = pytest.mark.slow  # real witness processes and `truss` subprocesses

TOOLS_SERVER = Path(__file__).resolve().parent.parent / "e2e" / "servers" / "tools.py"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Path, IdentityKey, Witness, Witness]]:
    """A home with two recorded sessions and two running witnesses that follow its log."""
    home, key = make_home(tmp_path)
    record_sessions(home, key, ["s_one", "s_two"])
    w1, w2 = make_witness(tmp_path, "w1"), make_witness(tmp_path, "w2")
    for w in (w1, w2):
        w.configure([key.verifier.vkey])
        w.start()
    try:
        yield home, key, w1, w2
    finally:
        for w in (w1, w2):
            w.stop()


def _policies(home: Path, w1: Witness, w2: Witness, *, w2_url: str | None = None) -> tuple[Path, Path]:
    lines = [w1.policy_line(), w2.policy_line(w2_url)]
    both = write_policy(home, [*lines, "group both all w1 w2"], quorum="quorum both")
    either = write_policy(home, [*lines, "group either any w1 w2"], name="either.policy", quorum="quorum either")
    write_witness_config(home)
    return both, either


def _checkpoint(home: Path, *args: str) -> tuple[int, dict[str, object]]:
    proc = truss(home, "ledger", "checkpoint", "--witness", "--json", *args)
    assert "Traceback" not in proc.stderr
    return proc.returncode, as_json(proc)


def _outcomes(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    witness = doc["witness"]
    assert isinstance(witness, dict)
    return {str(o["witness"]): o for o in witness["outcomes"]}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


def test_a_checkpoint_cosigned_by_both_witnesses_meets_a_two_of_two_quorum_in_the_ledger_and_in_a_bundle(
    pair: tuple[Path, IdentityKey, Witness, Witness], tmp_path: Path
) -> None:
    home, key, w1, w2 = pair
    both, _ = _policies(home, w1, w2)
    code, doc = _checkpoint(home)
    assert code == 0, doc
    assert {k: v["outcome"] for k, v in _outcomes(doc).items()} == {"w1": "cosigned", "w2": "cosigned"}
    note = str(doc["note"]).encode()
    assert [s.name for s in parse_note(note).signatures] == [key.name, w1.key.name, w2.key.name]
    witnessed = [e for e in log_entries(home) if e["kind"] == "checkpoint_witnessed"]
    assert sorted((e["witness"], e["outcome"]) for e in witnessed) == [("w1", "cosigned"), ("w2", "cosigned")]
    verify = truss(home, "ledger", "verify", "--policy", str(both))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "meets the quorum (w1, w2)" in verify.stdout
    assert truss(home, "ledger", "verify", "s_one", "--policy", str(both)).returncode == 0
    bundle = tmp_path / "bundle.json"
    assert truss(home, "ledger", "export", "s_one", "-o", str(bundle)).returncode == 0
    carried = json.loads(bundle.read_text())["checkpoint"]
    assert w2.key.name in carried, "the bundle carries the cosigned checkpoint"
    offline = truss(None, "ledger", "verify", "--bundle", str(bundle), "--policy", str(both),
                    "--trusted-key", key.verifier.vkey)  # fmt: skip
    assert offline.returncode == 0, offline.stdout + offline.stderr
    listing = as_json(truss(home, "sessions", "--json"))
    assert sorted(s["id"] for s in listing["sessions"]) == ["s_one", "s_two"], "the log's own session is no run"


def test_with_one_witness_down_a_run_ends_with_its_verdict_and_two_of_two_fails_naming_the_missing_witness(
    pair: tuple[Path, IdentityKey, Witness, Witness], tmp_path: Path
) -> None:
    home, _, w1, w2 = pair
    down_url = w2.url
    port = int(down_url.rsplit(":", 1)[1])
    w2.stop()
    both, either = _policies(home, w1, w2, w2_url=down_url)
    contract = tmp_path / "echo.toml"
    contract.write_text(
        f"""
[contract]
name = "echo"
intent = "echo once"
[agent]
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = {{ text = "hi" }}
[[mcp.servers]]
name = "tools"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TOOLS_SERVER))}]
allow_tools = ["echo"]
connect_timeout = "20s"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:tools:echo"
""",
        encoding="utf-8",
    )
    run = truss(home, "run", str(contract))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict     pass" in run.stdout
    assert "not witnessed" in run.stderr and "w2 unreachable" in run.stderr
    outcomes = {e["witness"]: e["outcome"] for e in log_entries(home) if e["kind"] == "checkpoint_witnessed"}
    assert outcomes == {"w1": "cosigned", "w2": "unreachable"}
    short = truss(home, "ledger", "verify", "--policy", str(both))
    assert short.returncode == 1, short.stdout + short.stderr
    assert "quorum_short" in short.stdout and "missing: w2" in short.stdout
    doc = as_json(truss(home, "ledger", "verify", "--policy", str(both), "--json"))
    assert doc["policy"]["short"] == [{"group": "both", "have": 1, "need": 2, "missing": ["w2"]}]
    assert truss(home, "ledger", "verify", "--policy", str(either)).returncode == 0
    code, _ = _checkpoint(home)
    assert code == 4, "still not witnessed to the quorum: exit 4, retry later"
    w2.start(port=port)
    code, doc = _checkpoint(home)
    assert code == 0, doc
    assert truss(home, "ledger", "verify", "--policy", str(both)).returncode == 0


def test_a_witness_that_answers_409_gets_a_consistency_proof_from_the_size_it_names(
    pair: tuple[Path, IdentityKey, Witness, Witness],
) -> None:
    home, key, w1, w2 = pair
    _policies(home, w1, w2)
    assert _checkpoint(home)[0] == 0
    record_sessions(home, key, ["s_three"])
    # Someone else (a monitor, another replica) shows w1 a later checkpoint first.
    with closing(open_store(home / "ledger.db", key=key, clock=SystemClock())) as store:
        from truss.ledger.merkle import consistency_proof
        from truss.ledger.note import sign_checkpoint

        earlier = max(cp.size for cp in store.checkpoints())
        later = sign_checkpoint(store, key)
        assert later.note is not None
        proof = consistency_proof(earlier, later.size, store.node)
    body = format_add_checkpoint(AddCheckpoint(earlier, tuple(proof), later.note))
    answer = httpx2.post(w1.url + "/add-checkpoint", content=body, timeout=30)
    assert answer.status_code == 200
    record_sessions(home, key, ["s_four"])
    code, doc = _checkpoint(home)
    assert code == 0, doc
    outcomes = _outcomes(doc)
    assert (outcomes["w1"]["outcome"], outcomes["w1"]["attempts"]) == ("cosigned", 2), "409, then proven again"
    assert outcomes["w2"]["attempts"] == 1


def test_a_bad_consistency_proof_is_refused_with_422_and_kept_as_evidence(
    pair: tuple[Path, IdentityKey, Witness, Witness],
) -> None:
    home, key, w1, w2 = pair
    _policies(home, w1, w2)
    assert _checkpoint(home)[0] == 0
    record_sessions(home, key, ["s_three", "s_four"])
    with closing(open_store(home / "ledger.db", key=key, clock=SystemClock())) as store:
        from truss.ledger.merkle import consistency_proof
        from truss.ledger.note import sign_checkpoint

        earlier = max(cp.size for cp in store.checkpoints())
        later = sign_checkpoint(store, key)
        assert later.note is not None
        proof = consistency_proof(earlier, later.size, store.node)
    proof[0] = bytes(32)
    answer = httpx2.post(
        w1.url + "/add-checkpoint", content=format_add_checkpoint(AddCheckpoint(earlier, tuple(proof), later.note)),
        timeout=30,
    )  # fmt: skip
    assert answer.status_code == 422
    shown = w1.show("--evidence")
    assert shown["evidence_count"] == 1 and shown["evidence"][0]["reason"] == "bad_proof"
    assert shown["evidence"][0]["size"] == later.size
    assert shown["logs"][0]["size"] == earlier, "nothing was cosigned on the bad proof"


def test_a_log_rewritten_with_its_key_is_refused_by_the_witness_that_saw_it_and_the_two_notes_prove_a_fork(
    pair: tuple[Path, IdentityKey, Witness, Witness], tmp_path: Path
) -> None:
    home, key, w1, w2 = pair
    write_policy(home, [w1.policy_line()], quorum="quorum w1")
    write_witness_config(home)
    first = tmp_path / "first.note"
    code, _ = _checkpoint(home, "-o", str(first))
    assert code == 0
    # The key holder rewrites history: a ledger of the same size, other entries, the same key.
    rewritten, _ = make_home(tmp_path, "rewritten", key=key)
    record_sessions(rewritten, key, ["s_one", "s_two"], salt="rewritten")
    write_policy(rewritten, [w1.policy_line(), w2.policy_line()], quorum="quorum w1")
    write_witness_config(rewritten)
    second = tmp_path / "second.note"
    code, doc = _checkpoint(rewritten, "-o", str(second))
    assert code == 4
    outcomes = _outcomes(doc)
    assert (outcomes["w1"]["outcome"], outcomes["w1"]["reason"]) == ("refused", "inconsistent")
    assert outcomes["w2"]["outcome"] == "cosigned", "a witness that never saw the first history cosigns the second"
    evidence = w1.show("--evidence")["evidence"]
    assert [e["reason"] for e in evidence] == ["fork"] and evidence[0]["held"] is not None
    either = write_policy(tmp_path, [w1.policy_line(), w2.policy_line(), "group either any w1 w2"],
                          name="auditor.policy", quorum="quorum either")  # fmt: skip
    audit = truss(None, "ledger", "verify", "--checkpoint", str(first), "--checkpoint", str(second),
                  "--policy", str(either), "--trusted-key", key.verifier.vkey)  # fmt: skip
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert "(fork)" in audit.stdout and "two different trees of size" in audit.stdout
    assert first.read_text().split("\n")[2] in audit.stdout and second.read_text().split("\n")[2] in audit.stdout
    doc = as_json(truss(None, "ledger", "verify", "--checkpoint", str(first), "--checkpoint", str(second),
                        "--policy", str(either), "--trusted-key", key.verifier.vkey, "--json"))  # fmt: skip
    fork = doc["policy"]["fork"]
    assert [f["cosigned_by"] for f in fork] == [["w1"], ["w2"]] and fork[0]["size"] == fork[1]["size"]
    assert fork[0]["root"] != fork[1]["root"]
    honest = truss(home, "ledger", "verify", "--all", "--checkpoint", str(second))
    assert honest.returncode == 1 and "(fork)" in honest.stdout, "the honest log disagrees with the rewritten note"


def test_a_witness_stops_cleanly_on_sigterm_and_serves_its_latest_checkpoint(
    pair: tuple[Path, IdentityKey, Witness, Witness],
) -> None:
    home, key, w1, w2 = pair
    _policies(home, w1, w2)
    assert _checkpoint(home)[0] == 0
    import hashlib

    served = httpx2.get(f"{w1.url}/{hashlib.sha256(key.name.encode()).hexdigest()}/checkpoint", timeout=30)
    assert served.status_code == 200
    names = [s.name for s in parse_note(served.content).signatures]
    assert names == [key.name, w1.key.name], "the log's signature and the witness's own cosignature"
    assert httpx2.get(f"{w1.url}/{'0' * 64}/checkpoint", timeout=30).status_code == 404
    assert base64.b64decode(served.text.split("\n")[2])
    assert w1.stop() == 0
