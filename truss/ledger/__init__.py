"""The signed ledger: canonical entries, Ed25519 signatures, hash chains, a Merkle log, bundles.

The core (canonical, entry, merkle, note, envelope, verify, bundle) is sans-IO: bytes and trusted
keys in, verified objects out. Only ``store`` touches disk.

``__all__`` is what auditors and integrators use: build and read entries, verify a ledger or an
offline bundle against keys they trust, open checkpoints and verdict envelopes, open a store.
Every name but the canonical encoder is loaded on first use, so ``import truss.ledger`` does not
load PyNaCl (``keys``) or sqlite3 (``store``) until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from truss.ledger.canonical import CanonicalError, canonical, sha256_ref, value_ref

if TYPE_CHECKING:
    from truss.ledger.bundle import (
        BundleReport,
        BundleSource,
        SinceReport,
        TlogProof,
        check_bundle,
        export_bundle,
        format_tlog_proof,
        parse_tlog_proof,
        verify_bundle,
        verify_since,
    )
    from truss.ledger.entry import KINDS, PAYLOAD_TYPE, ZERO_HASH, Record, StoredEntry, entry_bytes
    from truss.ledger.envelope import (
        VERDICT_PREDICATE_TYPE,
        Envelope,
        VerdictStatement,
        open_verdict,
        parse_envelope,
        sign_verdict,
        verdict_statement,
        verify_envelope,
    )
    from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey, key_id_of
    from truss.ledger.merkle import leaf_hash, verify_consistency, verify_inclusion
    from truss.ledger.note import Checkpoint, Note, open_checkpoint, open_note, parse_checkpoint, parse_note
    from truss.ledger.store import LedgerStore, SessionInfo, SqliteStore, StoredCheckpoint, open_store
    from truss.ledger.verify import REASONS, Finding, VerifyReport, check_entries, verify_entries, verify_ledger

# Public name -> the submodule that defines it (loaded by ``__getattr__`` on first use).
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "BundleReport",
            "BundleSource",
            "SinceReport",
            "TlogProof",
            "check_bundle",
            "export_bundle",
            "format_tlog_proof",
            "parse_tlog_proof",
            "verify_bundle",
            "verify_since",
        ),
        "bundle",
    ),
    **dict.fromkeys(("KINDS", "PAYLOAD_TYPE", "ZERO_HASH", "Record", "StoredEntry", "entry_bytes"), "entry"),
    **dict.fromkeys(
        (
            "VERDICT_PREDICATE_TYPE",
            "Envelope",
            "VerdictStatement",
            "open_verdict",
            "parse_envelope",
            "sign_verdict",
            "verdict_statement",
            "verify_envelope",
        ),
        "envelope",
    ),
    **dict.fromkeys(("IdentityKey", "TrustedKeys", "VerifierKey", "key_id_of"), "keys"),
    **dict.fromkeys(("leaf_hash", "verify_consistency", "verify_inclusion"), "merkle"),
    **dict.fromkeys(("Checkpoint", "Note", "open_checkpoint", "open_note", "parse_checkpoint", "parse_note"), "note"),
    **dict.fromkeys(("LedgerStore", "SessionInfo", "SqliteStore", "StoredCheckpoint", "open_store"), "store"),
    **dict.fromkeys(
        ("REASONS", "Finding", "VerifyReport", "check_entries", "verify_entries", "verify_ledger"), "verify"
    ),
}

__all__ = [
    "KINDS",
    "PAYLOAD_TYPE",
    "REASONS",
    "VERDICT_PREDICATE_TYPE",
    "ZERO_HASH",
    "BundleReport",
    "BundleSource",
    "CanonicalError",
    "Checkpoint",
    "Envelope",
    "Finding",
    "IdentityKey",
    "LedgerStore",
    "Note",
    "Record",
    "SessionInfo",
    "SinceReport",
    "SqliteStore",
    "StoredCheckpoint",
    "StoredEntry",
    "TlogProof",
    "TrustedKeys",
    "VerdictStatement",
    "VerifierKey",
    "VerifyReport",
    "canonical",
    "check_bundle",
    "check_entries",
    "entry_bytes",
    "export_bundle",
    "format_tlog_proof",
    "key_id_of",
    "leaf_hash",
    "open_checkpoint",
    "open_note",
    "open_store",
    "open_verdict",
    "parse_checkpoint",
    "parse_envelope",
    "parse_note",
    "parse_tlog_proof",
    "sha256_ref",
    "sign_verdict",
    "value_ref",
    "verdict_statement",
    "verify_bundle",
    "verify_consistency",
    "verify_entries",
    "verify_envelope",
    "verify_inclusion",
    "verify_ledger",
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
