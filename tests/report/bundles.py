"""Every tampered bundle of the test suite, with the key each must be checked against.

- ``tests/ledger/tampered_bundles/``: the bundle tests' fixtures, one per attack on a bundle;
- ``tests/report/tampered/``: inputs where JSON in a browser and JSON in Python could part;
- ``tests/ledger/tampered/``: the chain fixtures (entry lists), each put into the bundle of the
  golden ledger it was cut from: its entries and payloads replace the session's, and each entry
  gets the inclusion proof of the index it claims, as an attacker holding the real log would give.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ledger._fixtures import TAMPERED as CHAIN_FIXTURES
from tests.ledger._fixtures import build_store, golden_key
from tests.ledger.test_bundle import TAMPERED as BUNDLE_FIXTURES
from tests.ledger.test_bundle import log_key
from truss.ledger.bundle import export_bundle
from truss.ledger.canonical import canonical
from truss.ledger.merkle import inclusion_proof

REPORT_FIXTURES = Path(__file__).resolve().parent / "tampered"


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    vkey: str


def bundle_cases() -> list[Case]:
    """The bundle fixtures and the page-specific ones (trusted: the bundle tests' log key)."""
    vkey = log_key().verifier.vkey
    files = sorted([*BUNDLE_FIXTURES.glob("*.json"), *REPORT_FIXTURES.glob("*.json")])
    return [Case(f"{f.parent.name}/{f.stem}", f, vkey) for f in files]


def chain_cases(directory: Path) -> list[Case]:
    """The chain fixtures, each written into ``directory`` as a bundle (trusted: the golden key)."""
    key = golden_key()
    store = build_store(key)
    clean: dict[str, Any] = json.loads(export_bundle(store, "s_alpha", vkey=key.verifier.vkey, signer=key))
    size = store.tree_size()
    cases: list[Case] = []
    for fixture_path in sorted(CHAIN_FIXTURES.glob("*.json")):
        fixture: dict[str, Any] = json.loads(fixture_path.read_text(encoding="utf-8"))
        doc = dict(clean, entries=fixture["entries"], blobs=fixture["blobs"])
        proofs: list[list[str]] = []
        for item in fixture["entries"]:
            index = item["entry"]["index"]
            hashes = inclusion_proof(index, size, store.node) if 0 <= index < size else []
            proofs.append([base64.b64encode(h).decode("ascii") for h in hashes])
        doc["inclusion"] = proofs
        path = directory / f"{fixture_path.stem}.json"
        path.write_bytes(canonical(doc))
        cases.append(Case(f"tampered/{fixture_path.stem}", path, fixture["trusted"][0]))
    return cases


def written_cases(directory: Path, group: str, variants: dict[str, dict[str, Any]], vkey: str) -> list[Case]:
    """Each bundle of ``variants`` written into ``directory`` as canonical JSON, in name order, all
    to be checked against ``vkey``."""
    cases: list[Case] = []
    for name, doc in sorted(variants.items()):
        path = directory / f"{name}.json"
        path.write_bytes(canonical(doc))
        cases.append(Case(f"{group}/{name}", path, vkey))
    return cases
