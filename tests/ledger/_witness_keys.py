"""Deterministic test keys for the witness and rotation tests (fixed seeds: never for real use)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from truss.ledger.keys import ED25519_COSIGNATURE_ALG, CosignerKey, IdentityKey

C2SP = Path(__file__).parent / "vectors" / "c2sp"
ORIGIN = "truss.test/witnessed-log"


def seed(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def log_key(label: str = "log key", name: str = ORIGIN) -> IdentityKey:
    return IdentityKey.from_seed(seed(label), name)


def witness_key(label: str, name: str | None = None, alg: int = ED25519_COSIGNATURE_ALG) -> CosignerKey:
    return CosignerKey.from_seed(seed(label), name or f"witness.test/{label}", alg)
