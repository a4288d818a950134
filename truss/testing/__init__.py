"""Fakes shipped with the library for tests of Truss and of code built on it.

``ManualClock`` (deterministic time and ids). Later pieces add a memory store, a fake tool
transport and the store conformance check ``check_ledger_store``.
"""

from __future__ import annotations

from truss.testing._clock import ManualClock

__all__ = ["ManualClock"]
