"""The signed ledger: canonical entries, Ed25519 signatures, hash chains, a Merkle log, bundles.

The core (canonical, entry, merkle, note, envelope, verification, audit, bundle) is sans-IO:
bytes and trusted keys in, verified objects out. Only the stores (``truss.ledger.stores``) do I/O.

``__all__`` is what auditors and integrators use, around one verb each:

- ``verify(evidence, trusted)``: a store (the whole log or one ``session``) or an exported bundle
  (``bytes``) against the keys the caller trusts; a report (``VerifyReport``, ``BundleReport``)
  whose ``raise_for_failure()`` is the raising form. ``verify_since`` proves a log only grew
  since a checkpoint kept earlier (``SinceReport``).
- ``open_store(url_or_path, key=..., clock=...)``: a ``LedgerStore`` (SQLite, memory, or a
  registered scheme); entries are appended as ``Record``s and read back as ``StoredEntry``s.
- ``export_bundle``, ``open_checkpoint``, ``open_verdict``: the evidence a run leaves.
- keys: ``IdentityKey`` (signs), ``VerifierKey`` and ``TrustedKeys`` (verify).

Everything else stays importable from its module (``truss.ledger.merkle``, ``.note``, ...).
Every name but the canonical encoder is loaded on first use, so ``import truss.ledger`` does not
load PyNaCl (``keys``) or sqlite3 (the SQLite store) until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from truss.ledger.canonical import CanonicalError, canonical

if TYPE_CHECKING:
    from truss.ledger.audit import SinceReport, verify, verify_since
    from truss.ledger.bundle import BundleReport, export_bundle
    from truss.ledger.entry import Record, StoredEntry
    from truss.ledger.envelope import VerdictStatement, open_verdict
    from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey
    from truss.ledger.note import Checkpoint, open_checkpoint
    from truss.ledger.stores import LedgerStore, SessionInfo, StoredCheckpoint, open_store
    from truss.ledger.verification import VerifyReport

# Public name -> the submodule that defines it (loaded by ``__getattr__`` on first use).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("SinceReport", "verify", "verify_since"), "audit"),
    **dict.fromkeys(("BundleReport", "export_bundle"), "bundle"),
    **dict.fromkeys(("Record", "StoredEntry"), "entry"),
    **dict.fromkeys(("VerdictStatement", "open_verdict"), "envelope"),
    **dict.fromkeys(("IdentityKey", "TrustedKeys", "VerifierKey"), "keys"),
    **dict.fromkeys(("Checkpoint", "open_checkpoint"), "note"),
    **dict.fromkeys(("LedgerStore", "SessionInfo", "StoredCheckpoint", "open_store"), "stores"),
    "VerifyReport": "verification",
}

__all__ = [
    "BundleReport",
    "CanonicalError",
    "Checkpoint",
    "IdentityKey",
    "LedgerStore",
    "Record",
    "SessionInfo",
    "SinceReport",
    "StoredCheckpoint",
    "StoredEntry",
    "TrustedKeys",
    "VerdictStatement",
    "VerifierKey",
    "VerifyReport",
    "canonical",
    "export_bundle",
    "open_checkpoint",
    "open_store",
    "open_verdict",
    "verify",
    "verify_since",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'truss.ledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"truss.ledger.{module}"), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
