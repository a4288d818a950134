"""Fixtures of the security tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.durability.support import make_home


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A fresh ``TRUSS_HOME`` (mode 0700) with its identity key, for a test that runs ``truss``."""
    return make_home(tmp_path / "home")
