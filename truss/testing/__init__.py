"""Fakes shipped with the library for tests of Truss and of code built on it.

``ManualClock`` (deterministic time and ids). Later pieces add a memory store, a fake tool
transport and the store conformance check ``check_ledger_store``.
"""

from __future__ import annotations

from truss.testing._clock import ManualClock
from truss.testing._store import MemoryStore, check_ledger_store
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
