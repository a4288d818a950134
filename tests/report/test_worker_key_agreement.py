"""The page and ``truss ledger verify --bundle`` agree on bundles of a ledger with worker keys (a
shared ledger with several workers): the page follows the ``key_admitted`` and ``key_removed``
statements a bundle carries, as the Python verifier does, and takes a checkpoint only from a log
key (a worker key signs entries and verdicts, never a checkpoint)."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.report.agreement import page_against_cli
from tests.report.bundles import Case, written_cases
from tests.report.cdp import Page
from truss.ledger.bundle import export_bundle
from truss.ledger.entry import Record
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keyhistory import admission_record, append_to_log, join_request, removal_record
from truss.ledger.keys import IdentityKey
from truss.ledger.note import parse_checkpoint, parse_note, sign_checkpoint_note
from truss.ledger.stores import open_store
from truss.testing import ManualClock

ORIGIN = "workers.report.truss.test"
RUN = [Record("session_started", {"contract": "c"}), Record("session_ended", {"status": "pass"})]


def _verdict(doc: dict[str, Any], key: IdentityKey, checkpoint: str | None) -> dict[str, Any]:
    statement = verdict_statement(session=doc["session"], head=doc["entries"][-1]["hash"], status="pass", checks=[],
                                  contract_hash="sha256:c", checkpoint=checkpoint)  # fmt: skip
    return sign_verdict(statement, key).to_json()


def _bundles(tmp_path: Path) -> list[Case]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    log = IdentityKey.create(home / "identity.key", name=ORIGIN)
    worker, gone = IdentityKey.generate(ORIGIN), IdentityKey.generate(ORIGIN)
    db, clock = home / "ledger.db", ManualClock()
    with closing(open_store(db, key=log, clock=clock)) as store:
        store.append("s_log", RUN)
        records = [admission_record(k.verifier, join_request(k)) for k in (worker, gone)]
        append_to_log(store, records)
    with closing(open_store(db, key=worker, clock=clock, create=False)) as store:
        store.append("s_worker", RUN)
    with closing(open_store(db, key=gone, clock=clock, create=False)) as store:
        store.append("s_gone", RUN)
    with closing(open_store(db, key=log, clock=clock, create=False)) as store:
        append_to_log(store, [removal_record(gone.verifier)])
    with closing(open_store(db, key=worker, clock=clock, create=False)) as store:
        store.append("s_late", RUN)  # after the removal of the other worker's key
    variants: dict[str, dict[str, Any]] = {}
    with closing(open_store(db, key=log, clock=clock, create=False)) as store:
        doc: dict[str, Any] = json.loads(export_bundle(store, "s_late", vkey=log.verifier.vkey, signer=log))
        before: dict[str, Any] = json.loads(export_bundle(store, "s_gone", vkey=log.verifier.vkey, signer=log))
    kinds = [item["entry"]["entry"]["kind"] for item in doc["key_history"]]
    assert kinds == ["key_admitted", "key_admitted", "key_removed"], "the bundle carries the worker statements"
    doc["envelope"] = _verdict(doc, worker, None)  # the worker ends its run and signs its verdict
    variants["worker_session_with_its_verdict"] = doc
    before["envelope"] = _verdict(before, gone, None)
    variants["session_of_a_worker_removed_since"] = before
    checkpoint = parse_checkpoint(parse_note(doc["checkpoint"].encode()).text)
    # The worker key signs the bundle's own checkpoint (same size and root): not the log's signature.
    by_worker = json.loads(json.dumps(doc))
    note = sign_checkpoint_note(ORIGIN, checkpoint.size, checkpoint.root, worker).note
    assert note is not None
    by_worker["checkpoint"] = note.decode()
    variants["checkpoint_signed_by_a_worker_key"] = by_worker
    # The worker's verdict names a checkpoint of the bundle's size with another root, signed by the
    # worker key: not the log's checkpoint, so no evidence of a fork either.
    forked = json.loads(json.dumps(doc))
    note = sign_checkpoint_note(ORIGIN, checkpoint.size, bytes(32), worker).note
    assert note is not None
    forked["envelope"] = _verdict(forked, worker, note.decode())
    variants["verdict_naming_a_checkpoint_a_worker_key_signed"] = forked
    # The removed worker's key signs the verdict of a session that ended after its removal.
    resigned = json.loads(json.dumps(doc))
    resigned["envelope"] = _verdict(resigned, gone, None)
    variants["verdict_signed_by_a_removed_worker_key"] = resigned
    return written_cases(tmp_path, "workers", variants, log.verifier.vkey)


@pytest.mark.slow
def test_the_page_follows_worker_key_admissions_and_removals_and_refuses_what_truss_ledger_verify_refuses(
    page: Page, tmp_path: Path
) -> None:
    opened, differences = page_against_cli(page, _bundles(tmp_path), "worker_session_with_its_verdict", tmp_path)
    assert opened, "the page follows the admissions from the log key"
    assert differences == []
