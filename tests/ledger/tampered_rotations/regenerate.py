"""Regenerate the rotation fixtures here (Ed25519 is deterministic: the same bytes every time).

Run from the repository root: ``python -m tests.ledger.tampered_rotations.regenerate``. Each file
is ``{"trusted": [<vkey the verifier starts from>], "entries": [<portable @log entries>]}``: the
log's own session as a verifier would read it, with one forged or malformed rotation statement.
The keys are test-only keys from fixed seeds.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tests.ledger._witness_keys import ORIGIN, log_key
from truss.ledger.entry import ZERO_HASH, StoredEntry, seal
from truss.ledger.keyhistory import LOG_SESSION, rotation_record, rotation_statement
from truss.ledger.keys import IdentityKey

HERE = Path(__file__).parent
K0, K1, K2 = log_key("rotation key 0"), log_key("rotation key 1"), log_key("rotation key 2")
EVIL = log_key("an attacker's key under the log's name")


class _Chain:
    def __init__(self) -> None:
        self.entries: list[StoredEntry] = []
        self.index = 10  # the log's own session starts somewhere in the middle of the log

    def add(self, signer: IdentityKey, kind: str, body: dict[str, Any]) -> StoredEntry:
        prev = self.entries[-1].hash if self.entries else ZERO_HASH
        entry = seal(signer, log=ORIGIN, session=LOG_SESSION, seq=len(self.entries), index=self.index,
                     ts=1_700_000_000_000 + self.index, kind=kind, body=body, prev=prev)  # fmt: skip
        self.entries.append(entry)
        self.index += 3  # runs' entries lie between the log's own
        return entry

    def rotate(self, signer: IdentityKey, old: IdentityKey, new: IdentityKey, **override: Any) -> None:
        body = dict(rotation_record(old, new, self.index + 1).body)
        body.update(override)
        self.add(signer, "key_rotated", body)


def _start() -> _Chain:
    chain = _Chain()
    chain.add(K0, "session_started", {"scope": "log"})
    return chain


def main() -> None:
    cases: dict[str, _Chain] = {}

    valid = _start()
    valid.rotate(K0, K0, K1)
    valid.rotate(K1, K1, K2)
    cases["valid_two_rotations"] = valid

    c = _start()
    c.rotate(EVIL, K0, EVIL)
    cases["forged_rotation_signed_by_the_key_it_introduces"] = c

    c = _start()
    c.rotate(K0, K0, K1)
    c.rotate(K0, K0, EVIL)
    cases["rotation_signed_by_a_retired_key"] = c

    c = _start()
    c.rotate(K0, K1, K2)
    cases["rotation_naming_another_key_as_the_one_replaced"] = c

    c = _start()
    c.rotate(K0, K0, K1, from_index=c.index + 50)
    cases["rotation_with_a_from_index_in_the_future"] = c

    c = _start()
    stolen = rotation_statement(ORIGIN, K1.verifier.vkey, K0.verifier.vkey, c.index + 1)
    c.rotate(K0, K0, K1, proof=base64.b64encode(EVIL.sign(stolen)).decode())
    cases["rotation_without_the_new_keys_consent"] = c

    c = _start()
    c.rotate(K0, K0, K1)
    altered = c.entries[-1].to_json()
    altered["entry"]["body"]["key"] = EVIL.verifier.vkey
    c.entries[-1] = StoredEntry.from_json(altered)
    cases["rotation_body_changed_after_signing"] = c

    for name, chain in cases.items():
        doc = {"trusted": [K0.verifier.vkey], "entries": [e.to_json() for e in chain.entries]}
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
