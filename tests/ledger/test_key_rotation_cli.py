"""``truss key rotate`` and ``truss key show --history`` as a user runs them, and what verification
makes of a rotation: followed from the first key, and a forged statement refused."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import truss_cmd
from truss._clock import SystemClock
from truss.ledger.canonical import canonical
from truss.ledger.entry import Record
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keyhistory import LOG_SESSION, rotation_statement
from truss.ledger.keys import IdentityKey
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.stores import open_store

pytestmark = pytest.mark.slow  # `truss` in subprocesses


def truss(home: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["TRUSS_HOME"] = str(home)
    return subprocess.run([*truss_cmd(), *args], env=env, check=False, capture_output=True, text=True, timeout=60)


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def _record(home: Path, session: str) -> None:
    key = IdentityKey.load(home / "identity.key")
    with closing(open_store(home / "ledger.db", key=key, clock=SystemClock())) as store:
        records = [Record("session_started", {"contract": "c"}), Record("session_ended", {"status": "pass"})]
        store.append(session, records)


@pytest.fixture
def home(truss_home: Path) -> Path:
    assert truss(truss_home, "init", "--name", "rotating.truss.test").returncode == 0
    _record(truss_home, "s_before")
    return truss_home


def test_rotation_keeps_the_origin_and_entries_before_and_after_verify_from_the_first_key_alone(
    home: Path, tmp_path: Path
) -> None:
    first = truss(home, "key", "show").stdout.strip()
    rotated = truss(home, "key", "rotate", "--json")
    assert rotated.returncode == 0, rotated.stderr
    doc = _json(rotated)
    assert doc["old"] == first and doc["new"] != first
    assert doc["new"].split("+")[0] == first.split("+")[0], "the log's origin stays the same"
    assert doc["from_index"] == doc["statement"]["entry"]["index"] + 1
    assert truss(home, "key", "show").stdout.strip() == doc["new"]
    _record(home, "s_after")
    for args in ((), ("s_before",), ("s_after",)):
        proc = truss(home, "ledger", "verify", *args, "--trusted-key", first)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert truss(home, "ledger", "verify").returncode == 0, "by default a home starts from its first key"
    history = _json(truss(home, "key", "show", "--history", "--json"))
    assert [p["vkey"] for p in history["periods"]] == [first, doc["new"]]
    assert history["periods"][0]["until_index"] == doc["from_index"] == history["periods"][1]["from_index"]
    shown = truss(home, "key", "show", "--history")
    assert "rotation at log index" in shown.stdout and "(current)" in shown.stdout
    bundle = tmp_path / "after.json"
    assert truss(home, "ledger", "export", "s_after", "-o", str(bundle)).returncode == 0
    offline = truss(None, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", first)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert truss(home, "ledger", "verdict", "s_after").returncode == 2, "no verdict envelope for a recorded stub"


def test_the_retired_key_can_no_longer_sign_for_the_log(home: Path) -> None:
    retired = (home / "identity.key").read_text()
    assert truss(home, "key", "rotate").returncode == 0
    old_home = home.parent / "old-key"
    old_home.mkdir(mode=0o700)
    fd = os.open(old_home / "identity.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(retired)
    proc = truss(None, "--key", str(old_home / "identity.key"), "--db", str(home / "ledger.db"), "ledger", "checkpoint")
    assert proc.returncode == 2 and "retired by a key rotation" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_forged_rotation_statement_not_signed_by_the_old_key_fails_verification(home: Path) -> None:
    first = truss(home, "key", "show").stdout.strip()
    origin = first.split("+")[0]
    attacker = IdentityKey.generate(origin)  # same name, not the log's key
    with closing(open_store(home / "ledger.db", key=attacker, clock=SystemClock())) as store:
        size = store.tree_size()
        store.append(LOG_SESSION, [Record("session_started", {"scope": "log"})])
        proof = attacker.sign(rotation_statement(origin, attacker.verifier.vkey, first, size + 2))
        body = {"key": attacker.verifier.vkey, "replaces": first, "from_index": size + 2,
                "proof": base64.b64encode(proof).decode()}  # fmt: skip
        store.append(LOG_SESSION, [Record("key_rotated", body)], expect_index=size + 1)
    proc = truss(home, "ledger", "verify", "--trusted-key", first, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = _json(proc)
    assert doc["reason"] == "forged_rotation" and doc["session"] == LOG_SESSION
    assert truss(home, "key", "show", "--history").returncode == 1


def test_the_log_session_is_not_listed_as_a_run_and_cannot_be_resumed(home: Path) -> None:
    assert truss(home, "key", "rotate").returncode == 0
    for command in (("sessions", "--json"), ("ledger", "list", "--json")):
        listed = [s["id"] for s in _json(truss(home, *command))["sessions"]]
        assert listed == ["s_before"], command
    shown = truss(home, "ledger", "show", LOG_SESSION)
    assert shown.returncode == 0 and "key_rotated" in shown.stdout
    resumed = truss(home, "resume", LOG_SESSION)
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr


def test_an_old_checkpoint_signed_by_the_retired_key_past_its_period_is_refused_not_taken_for_a_fork(
    home: Path, tmp_path: Path
) -> None:
    # The key was rotated away (stolen, say). Whoever holds it can still sign a checkpoint of the
    # log as it is now, with another root; `verify --since` must not take that note for the log's
    # own and report the log as forked.
    first = truss(home, "key", "show").stdout.strip()
    retired = IdentityKey.load(home / "identity.key")
    assert truss(home, "key", "rotate").returncode == 0
    _record(home, "s_after")
    with closing(open_store(home / "ledger.db", key=None, clock=SystemClock(), create=False)) as store:
        size = store.tree_size()
    forged = sign_checkpoint_note(retired.name, size, bytes(32), retired).note
    assert forged is not None
    held = tmp_path / "forged.note"
    held.write_bytes(forged)
    proc = truss(home, "ledger", "verify", "--since", str(held), "--trusted-key", first, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _json(proc)["reason"] == "retired_key"


def _set_verdict(home: Path, session: str, key: IdentityKey) -> None:
    with closing(open_store(home / "ledger.db", key=None, clock=SystemClock(), create=False)) as store:
        info = store.session(session)
        assert info is not None
        statement = verdict_statement(
            session=session, head=info.head, status="pass", checks=[], contract_hash="sha256:other", checkpoint=None
        )
        store.set_envelope(session, canonical(sign_verdict(statement, key).to_json()))


def test_a_verdict_the_retired_key_signed_for_a_session_after_the_rotation_is_refused_by_ledger_verdict_and_verify(
    home: Path,
) -> None:
    first = truss(home, "key", "show").stdout.strip()
    retired = IdentityKey.load(home / "identity.key")
    assert truss(home, "key", "rotate").returncode == 0
    _record(home, "s_after")
    _set_verdict(home, "s_before", retired)  # signed by the key of that session's time
    _set_verdict(home, "s_after", IdentityKey.load(home / "identity.key"))
    for args in (("ledger", "verdict", "s_before"), ("ledger", "verdict", "s_after"), ("ledger", "verify", "--all")):
        proc = truss(home, *args, "--trusted-key", first)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    _set_verdict(home, "s_after", retired)
    verdict = truss(home, "ledger", "verdict", "s_after", "--trusted-key", first, "--json")
    assert verdict.returncode == 1 and "Traceback" not in verdict.stderr, verdict.stdout + verdict.stderr
    verified = truss(home, "ledger", "verify", "--all", "--trusted-key", first, "--json")
    assert (verified.returncode, _json(verified)["reason"]) == (1, "retired_key")
    assert truss(home, "ledger", "verdict", "s_before", "--trusted-key", first).returncode == 0
