"""A clock that moves only when told to."""

from __future__ import annotations


class ManualClock:
    """Deterministic ``Clock``: ``advance()`` moves time; ids count up from 1."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:
        self._ms = start_ms
        self._mono = 0.0
        self._next = 0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def new_id(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}_{self._next:026d}"

    def advance(self, seconds: float) -> None:
        self._ms += round(seconds * 1000)
        self._mono += seconds

    def set_wall_ms(self, ms: int) -> None:
        """Set the wall clock (forward or back, as an operator or NTP might); monotonic time stays."""
        self._ms = ms
