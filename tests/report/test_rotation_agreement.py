"""The page and ``truss ledger verify --bundle`` agree on bundles of a log whose key was rotated: the
page follows the ``key_history`` a bundle carries from the first key, as the Python verifier does,
and refuses what it refuses (a forged statement, one outside the checkpoint, a missing history)."""

from __future__ import annotations

import base64
import hashlib
import json
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.report.agreement import page_against_cli
from tests.report.bundles import Case, written_cases
from tests.report.cdp import Page
from truss.keyring import rotate_identity_key
from truss.ledger.bundle import export_bundle
from truss.ledger.canonical import canonical
from truss.ledger.entry import Record, entry_signing_payload
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keys import IdentityKey
from truss.ledger.note import parse_checkpoint, parse_note, sign_checkpoint_note
from truss.ledger.stores import open_store
from truss.testing import ManualClock

ORIGIN = "rotating.report.truss.test"


def _record(db: Path, key: IdentityKey, session: str, clock: ManualClock) -> None:
    with closing(open_store(db, key=key, clock=clock)) as store:
        records = [Record("session_started", {"contract": "c"}), Record("session_ended", {"status": "pass"})]
        store.append(session, records)


def _bundles(tmp_path: Path) -> list[Case]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    first = IdentityKey.create(home / "identity.key", name=ORIGIN)
    db, clock = home / "ledger.db", ManualClock()
    _record(db, first, "s_before", clock)
    rotate_identity_key(home / "identity.key", lambda k: open_store(db, key=k, clock=clock, create=False))
    current = IdentityKey.load(home / "identity.key")
    _record(db, current, "s_after", clock)
    with closing(open_store(db, key=current, clock=clock, create=False)) as store:
        after: dict[str, Any] = json.loads(export_bundle(store, "s_after", vkey=current.verifier.vkey, signer=current))
    assert after["key_history"], "a bundle after a rotation carries the statement"
    variants: dict[str, dict[str, Any]] = {"rotated_valid": after}
    variants["rotated_without_key_history"] = {k: v for k, v in after.items() if k != "key_history"}
    forged = json.loads(json.dumps(after))
    statement = forged["key_history"][0]["entry"]
    statement["entry"]["body"]["from_index"] += 1
    variants["rotation_statement_altered"] = forged
    resigned = json.loads(json.dumps(after))
    attacker = IdentityKey.generate(ORIGIN)
    item = resigned["key_history"][0]["entry"]
    item["entry"]["body"]["key"] = attacker.verifier.vkey
    raw = canonical(item["entry"])
    item.update(hash=hashlib.sha256(raw).hexdigest(), keyid=attacker.key_id,
                sig=base64.b64encode(attacker.sign(entry_signing_payload(raw))).decode())  # fmt: skip
    variants["rotation_statement_signed_by_another_key"] = resigned
    moved = json.loads(json.dumps(after))
    proof = moved["key_history"][0]["inclusion"]
    proof[0] = base64.b64encode(bytes(32)).decode()
    variants["rotation_statement_not_in_the_checkpoint"] = moved
    # A verdict naming a checkpoint of the bundle's size with another root, signed by the retired
    # key: not the log's checkpoint (that key no longer signs at that size), so no fork either.
    retired = json.loads(json.dumps(after))
    size = parse_checkpoint(parse_note(retired["checkpoint"].encode()).text).size
    forged = sign_checkpoint_note(ORIGIN, size, bytes(32), first).note
    assert forged is not None
    statement = verdict_statement(session="s_after", head=retired["entries"][-1]["hash"], status="pass", checks=[],
                                  contract_hash="sha256:x", checkpoint=forged.decode())  # fmt: skip
    retired["envelope"] = sign_verdict(statement, current).to_json()
    variants["verdict_naming_a_checkpoint_the_retired_key_signed"] = retired
    # The retired key re-signs the verdict of a session that ended after the rotation.
    resigned_verdict = json.loads(json.dumps(after))
    statement = verdict_statement(session="s_after", head=resigned_verdict["entries"][-1]["hash"], status="pass",
                                  checks=[], contract_hash="sha256:other", checkpoint=None)  # fmt: skip
    resigned_verdict["envelope"] = sign_verdict(statement, first).to_json()
    variants["verdict_resigned_by_the_retired_key"] = resigned_verdict
    return written_cases(tmp_path, "rotation", variants, first.verifier.vkey)


@pytest.mark.slow
def test_the_page_follows_a_key_rotation_and_refuses_what_truss_ledger_verify_refuses(
    page: Page, tmp_path: Path
) -> None:
    opened, differences = page_against_cli(page, _bundles(tmp_path), "rotated_valid", tmp_path)
    assert opened, "the page follows the rotation from the first key"
    assert differences == []
