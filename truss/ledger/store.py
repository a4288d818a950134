"""Compatibility: the stores moved to ``truss.ledger.stores`` (one module per backend).

Code written before the move keeps working: these are the names this module had, with
``open_store`` still the SQLite opener it was. New code opens a store with
``truss.ledger.stores.open_store(url_or_path, ...)`` and types it as ``LedgerStore``.
"""

from __future__ import annotations

from truss.ledger.stores.base import LedgerStore, SessionInfo, StoredCheckpoint, check_status, session_fields
from truss.ledger.stores.sqlite import SCHEMA_VERSION, SqliteStore
from truss.ledger.stores.sqlite import open_sqlite as open_store

__all__ = [
    "SCHEMA_VERSION",
    "LedgerStore",
    "SessionInfo",
    "SqliteStore",
    "StoredCheckpoint",
    "check_status",
    "open_store",
    "session_fields",
]
