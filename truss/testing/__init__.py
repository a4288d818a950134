"""Fakes shipped with the library for tests of Truss and of code built on it.

``ManualClock`` (deterministic time and ids), ``FakeTransport`` (a tool transport taking a plain
handler), ``MemoryStore`` (the in-memory ledger store, ``truss.ledger.stores.memory``, re-exported
here for tests) and ``check_ledger_store``, the conformance check every store backend must pass.
"""

from __future__ import annotations

from truss.ledger.stores.memory import MemoryStore
from truss.testing._clock import ManualClock
from truss.testing._conformance import check_ledger_store
from truss.testing._transport import FakeCall, FakeTransport, mounted_tool, mounted_tools, text_result

__all__ = [
    "FakeCall",
    "FakeTransport",
    "ManualClock",
    "MemoryStore",
    "check_ledger_store",
    "mounted_tool",
    "mounted_tools",
    "text_result",
]
