"""A resume keeps full garbage collections off its replayed record (``truss._collector``), and leaves
the collector as it found it: the operator's thresholds, nothing frozen, whatever way it ends."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.durability.support import TIMEOUT, long_counting_contract, make_home, truss
from truss._collector import ReplayCollections
from truss.runtime import Runtime
from truss.session import resume_session

STEPS = 30
HELD = 1 << 30


def _killed_session(tmp_path: Path) -> Path:
    home = make_home(tmp_path / "home")
    contract = long_counting_contract(tmp_path, STEPS)
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": "during_verdict"})
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    return home


@pytest.mark.anyio
async def test_a_resume_replays_without_full_collections_and_leaves_the_collector_as_it_found_it(
    tmp_path: Path,
) -> None:
    home = _killed_session(tmp_path)
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    seen: list[tuple[str, int]] = []

    def watch(event: Any) -> None:  # the oldest generation's threshold as each run event is sent
        seen.append((type(event).__name__, gc.get_threshold()[2]))

    from truss.mcp.client import connect

    with Runtime.open(home=home, connector=connect, events=(watch,)) as runtime, anyio.fail_after(TIMEOUT):
        outcome = await resume_session(runtime, "s1")
    assert outcome.status == "pass", outcome
    assert any(held == HELD for _, held in seen), seen  # replayed steps: full collections held off
    assert seen[-1][1] == thresholds[2]  # the run's end: the operator's thresholds again
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


def test_overlapping_resumes_give_the_thresholds_back_after_the_last_replay_and_unfreeze_after_the_last_exit() -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    keep: list[object] = [[i] for i in range(3)]  # containers alive through the windows
    with ReplayCollections() as first:
        with ReplayCollections() as second:
            assert gc.get_threshold()[2] == HELD
            first.release()
            assert gc.get_threshold()[2] == HELD  # the second still replays
            assert gc.get_freeze_count() == frozen  # nothing frozen while a replay goes on
            second.release()
            assert gc.get_threshold() == thresholds
            assert gc.get_freeze_count() > frozen  # the replays' survivors are out of the collector's view
            second.release()  # once only
        assert gc.get_freeze_count() > frozen  # the first window is still open
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen
    assert len(keep) == 3


def test_a_resume_that_starts_while_another_runs_live_freezes_nothing_more() -> None:
    frozen = gc.get_freeze_count()
    with ReplayCollections() as first:
        first.release()
        once = gc.get_freeze_count()
        assert once > frozen
        with ReplayCollections() as second:
            garbage: list[object] = []
            garbage.append(garbage)  # a cycle made after the first freeze
            del garbage
            second.release()
            assert gc.get_freeze_count() == once  # one snapshot per episode, not one per resume
    assert gc.get_freeze_count() == frozen


def test_a_resume_that_fails_before_its_replay_ends_still_gives_the_collector_back() -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(RuntimeError), ReplayCollections():
        assert gc.get_threshold()[2] == HELD
        raise RuntimeError("the read failed")
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


def _frozen(value: object) -> bool:
    """Whether ``value`` is out of the collector's view (gc.freeze()): its generations do not list it."""
    return not any(item is value for item in gc.get_objects())


@pytest.mark.anyio
async def test_a_resume_leaves_what_the_operator_froze_before_it_frozen(tmp_path: Path) -> None:
    # An application embedding Truss may freeze its start-up objects (gc.freeze(), as pre-fork
    # servers do to keep their pages shared); a resume must not hand them back to the collector.
    home = _killed_session(tmp_path)
    from truss.mcp.client import connect

    kept: list[object] = [[i] for i in range(3)]
    gc.freeze()
    try:
        assert _frozen(kept)
        with Runtime.open(home=home, connector=connect) as runtime, anyio.fail_after(TIMEOUT):
            outcome = await resume_session(runtime, "s1")
        assert outcome.status == "pass", outcome
        assert _frozen(kept)
        with ReplayCollections() as window, ReplayCollections():  # the same for windows that overlap
            window.release()
        assert _frozen(kept)
    finally:
        gc.unfreeze()
    assert not _frozen(kept)
