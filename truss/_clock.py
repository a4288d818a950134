"""The only place in Truss that reads the wall clock, the monotonic clock, or makes random ids.

Everything else receives a ``Clock``. Tests pass ``truss.testing.ManualClock`` so that time and
ids are deterministic. Ruff's banned-api rule keeps ``time.time``/``uuid.uuid4`` out of other
modules.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "new_owner_id", "parse_duration_ms"]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case: sortable, unambiguous


class Clock(Protocol):
    """Time and ids, injected."""

    def now_ms(self) -> int:
        """Wall-clock time, Unix milliseconds (recorded in entries)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""
        ...

    def new_id(self, prefix: str) -> str:
        """A fresh id such as ``s_01jd...``: time-ordered, 80 random bits."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000  # noqa: TID251 - this module is the one allowed reader

    def monotonic(self) -> float:
        return time.monotonic()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{_encode(self.now_ms(), 10)}{_encode(int.from_bytes(os.urandom(10), 'big'), 16)}"


def _encode(value: int, width: int) -> str:
    out: list[str] = []
    for _ in range(width):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@functools.lru_cache(maxsize=256)  # budgets re-read the same few durations on every call
@functools.lru_cache(maxsize=256)  # a contract's few durations are read on every call (budget, timeouts)
def parse_duration_ms(text: str) -> int:
    """``"30s"`` -> 30000. Units: ms, s, m, h, d; a positive integer before the unit.

    Raises ``ValueError`` with a readable message; callers wrap it in their own error.
    """
    s = text.strip()
    for unit in ("ms", "s", "m", "h", "d"):
        if s.endswith(unit):
            number = s[: -len(unit)]
            if number.isdigit() and number.isascii():
                value = int(number) * _UNITS_MS[unit]
                if value <= 0:
                    break
                return value
            break
    raise ValueError(f"bad duration {text!r}: write a positive whole number and a unit, e.g. '30s', '5m', '2h'")


def new_owner_id() -> str:
    """An id for one process's runtime as a session lease's owner (random; never from an injected clock,
    so taking a lease does not change the ids a test clock hands out)."""
    return f"own_{os.getpid()}_{_encode(int.from_bytes(os.urandom(10), 'big'), 16)}"
