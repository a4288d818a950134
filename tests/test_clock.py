"""The clock: durations parse strictly, ids are well formed and ordered, the manual clock is deterministic."""

from __future__ import annotations

import re

import pytest

from truss import SystemClock
from truss._clock import parse_duration_ms
from truss.testing import ManualClock

ID_RE = re.compile(r"^s_[0-9a-hjkmnp-tv-z]{26}$")


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("1s", 1000), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000), ("1d", 86_400_000)],
)
def test_durations_parse_to_milliseconds(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "30", "s", "0s", "-5s", "1.5s", "5 m", "5min", "٣s", "1e3ms", "+5s", "5S"])
def test_malformed_or_non_positive_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(text)


def test_system_clock_ids_are_well_formed_unique_and_prefixed() -> None:
    clock = SystemClock()
    ids = [clock.new_id("s") for _ in range(500)]
    assert all(ID_RE.match(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_system_clock_ids_sort_by_their_time_part() -> None:
    clock = SystemClock()
    first, second = clock.new_id("s"), clock.new_id("s")
    assert first[2:12] <= second[2:12]


def test_system_clock_monotonic_never_goes_back() -> None:
    clock = SystemClock()
    readings = [clock.monotonic() for _ in range(100)]
    assert readings == sorted(readings)


def test_manual_clock_moves_only_when_advanced_and_counts_ids() -> None:
    clock = ManualClock(start_ms=1_000)
    assert (clock.now_ms(), clock.monotonic()) == (1_000, 0.0)
    clock.advance(1.5)
    assert (clock.now_ms(), clock.monotonic()) == (2_500, 1.5)
    assert [clock.new_id("c"), clock.new_id("c")] == ["c_" + "0" * 25 + "1", "c_" + "0" * 25 + "2"]


def test_two_manual_clocks_give_the_same_sequence() -> None:
    a, b = ManualClock(), ManualClock()
    assert [a.new_id("s") for _ in range(3)] == [b.new_id("s") for _ in range(3)]
    assert a.now_ms() == b.now_ms()
