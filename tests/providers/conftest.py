"""Fixtures of the provider tests: a loopback HTTP server and a sleep that only records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers._support import LoopbackServer, RecordingSleep


@pytest.fixture
def loopback() -> Iterator[LoopbackServer]:
    server = LoopbackServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()
