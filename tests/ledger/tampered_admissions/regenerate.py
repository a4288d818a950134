"""Regenerate the worker-key fixtures here (Ed25519 is deterministic: the same bytes every time).

Run from the repository root: ``python -m tests.ledger.tampered_admissions.regenerate``. Each file
is ``{"trusted": [<the log key the verifier starts from>], "entries": [<portable @log entries>]}``:
the log's own session with worker keys admitted and removed, one statement forged or malformed in
each attack. The keys are test-only keys from fixed seeds.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tests.ledger._witness_keys import log_key
from tests.ledger.tampered_rotations.regenerate import K0, K1, _Chain, _start  # pyright: ignore[reportPrivateUsage]
from truss.ledger.keyhistory import admission_statement, join_request, removal_record
from truss.ledger.keys import IdentityKey

HERE = Path(__file__).parent
W1, W2 = log_key("worker key 1"), log_key("worker key 2")
EVIL = log_key("an attacker's key under the log's name")
ELSEWHERE = IdentityKey.from_seed(b"\x07" * 32, "truss.test/another-log")


def _admit(chain: _Chain, signer: IdentityKey, worker: IdentityKey, **override: Any) -> None:
    body: dict[str, Any] = {"key": worker.verifier.vkey, "proof": join_request(worker)}
    body.update(override)
    chain.add(signer, "key_admitted", body)


def _remove(chain: _Chain, signer: IdentityKey, worker: IdentityKey) -> None:
    chain.add(signer, "key_removed", dict(removal_record(worker.verifier).body))


def main() -> None:
    cases: dict[str, _Chain] = {}

    c = _start()
    _admit(c, K0, W1)
    _admit(c, K0, W2)
    _remove(c, K0, W1)
    cases["valid_two_workers_one_removed"] = c

    c = _start()
    _admit(c, K0, W1)
    _admit(c, W1, EVIL)
    cases["admission_signed_by_a_worker_key"] = c

    c = _start()
    _admit(c, K0, W1)
    _remove(c, W1, W1)
    cases["removal_signed_by_a_worker_key"] = c

    c = _start()
    c.rotate(K0, K0, K1)
    _admit(c, K0, EVIL)
    cases["admission_signed_by_a_retired_log_key"] = c

    c = _start()
    stolen = admission_statement(W1.name, W1.verifier.vkey)
    _admit(c, K0, W1, proof=base64.b64encode(EVIL.sign(stolen)).decode())
    cases["admission_without_the_workers_consent"] = c

    c = _start()
    _remove(c, K0, W1)
    cases["removal_of_a_key_never_admitted"] = c

    c = _start()
    _admit(c, K0, ELSEWHERE)
    cases["admission_of_a_key_of_another_log"] = c

    c = _start()
    _admit(c, K0, W1, role="log")
    cases["admission_with_an_extra_field"] = c

    c = _start()
    _admit(c, K0, W1)
    _remove(c, K0, W1)
    _admit(c, K0, W1)
    cases["admission_of_a_removed_key_again"] = c

    for name, chain in cases.items():
        doc = {"trusted": [K0.verifier.vkey], "entries": [e.to_json() for e in chain.entries]}
        (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
