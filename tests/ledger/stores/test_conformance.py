"""Every registered store scheme passes the one conformance check, opened as ``--db`` opens it."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from truss.ledger.stores import open_store, store_schemes
from truss.testing import check_ledger_store

# How a test names a fresh, empty ledger of each scheme; a new backend must add itself here.
_KNOWN = {"sqlite", "memory", "postgresql", "postgres"}


def test_every_registered_scheme_is_covered_by_the_conformance_test() -> None:
    assert set(store_schemes()) <= _KNOWN, "a registered store scheme has no conformance test below"


@pytest.mark.parametrize("scheme", sorted(_KNOWN))
def test_a_registered_store_passes_the_conformance_check_through_open_store(
    scheme: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    counter = itertools.count()
    fresh: Callable[[], str]
    if scheme == "sqlite":
        fresh = lambda: f"sqlite:///{tmp_path}/l{next(counter)}.db"  # noqa: E731
    elif scheme == "memory":
        fresh = lambda: "memory:"  # noqa: E731
    else:
        urls: Callable[[], str] = request.getfixturevalue("postgres_urls")
        fresh = lambda: urls().replace("postgresql://", f"{scheme}://", 1)  # noqa: E731
    check_ledger_store(lambda key, clock: open_store(fresh(), key=key, clock=clock))
