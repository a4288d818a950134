"""The ledger tests' shared store: each backend that needs no server, signing with a test module's key.

A module that asks for ``store`` defines ``store_key`` (an ``IdentityKey`` from its own seed), so the
fixture is one and the keys stay apart: entries one module signs never verify under another's key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from truss.ledger.keys import IdentityKey
from truss.ledger.stores import LedgerStore, open_store
from truss.testing import ManualClock


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path, store_key: IdentityKey) -> Iterator[LedgerStore]:
    url = "memory:" if request.param == "memory" else str(tmp_path / "ledger.db")
    opened = open_store(url, key=store_key, clock=ManualClock(), create=True)
    yield opened
    opened.close()
