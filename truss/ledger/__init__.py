"""The signed ledger: canonical entries, Ed25519 signatures, hash chains, a Merkle log, bundles.

The core (canonical, entry, merkle, note, verify, bundle) is sans-IO: bytes and trusted keys in,
verified objects out. Only ``store`` touches disk.
"""

from __future__ import annotations

from truss.ledger.canonical import CanonicalError, canonical, sha256_ref, value_ref

__all__ = ["CanonicalError", "canonical", "sha256_ref", "value_ref"]
