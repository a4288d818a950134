"""Full garbage collections kept off a resume's replayed record (docs/durability.md).

A resume reads a long session whole (every entry verified, R1), folds it into its journal and
replays its turns, and what that builds (the conversation so far, some hundred thousand container
objects) stays alive through the rest of the run. CPython's collector walks every live container
again at each full (oldest-generation) collection: on a 5,000-call session two of them during the
resume, about a tenth of its CPU, freeing next to nothing. ``ReplayCollections`` keeps those walks
off the replay and off what it built:

- while the record is read and replayed (``with`` entered), full collections are not started (the
  young generations are collected as always, so short-lived cycles still go);
- at ``release()`` (the loop replayed the last recorded turn) the operator's thresholds come back
  and what is alive then is moved out of the collector's view (``gc.freeze()``), so the run's
  live steps pay for what they allocate, not for the record;
- when the ``with`` block is left, everything frozen goes back to the collector (``gc.unfreeze()``)
  and is collected as usual from then on. A cycle that was garbage at the freeze is freed then,
  not before: the cost is bounded by the replay, and held no longer than the run. When something
  is frozen already (the operator's own ``gc.freeze()``), nothing is frozen here, so nothing is
  unfrozen either: ``gc.unfreeze()`` cannot tell one snapshot from another.

Windows may overlap (serve-mcp resuming two sessions at once): the thresholds come back when the
last replay ends, and the frozen objects when the last window is left. The freeze happens once per
such episode (when no window is replaying any more), so what it holds back from the collector is
one snapshot, however many resumes overlap: a cycle that was garbage then waits for the episode's
end, and everything allocated after it is collected as usual. Time-free and I/O-free.
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

__all__ = ["ReplayCollections"]

_NEVER = 1 << 30  # young collections before a full one: none within a window
_lock = threading.Lock()
_holding = 0  # windows still replaying: full collections off
_open = 0  # windows not yet left: frozen objects stay frozen
_saved: tuple[int, int, int] | None = None
_frozen = False  # gc.freeze() was called in this episode (until the last window is left)


class ReplayCollections:
    """One resume's window (``with``); ``release()`` ends its replay part, once."""

    def __init__(self) -> None:
        self._holding = False
        self._entered = False

    def __enter__(self) -> ReplayCollections:
        global _holding, _open, _saved
        with _lock:
            if _holding == 0:
                _saved = gc.get_threshold()
                gc.set_threshold(_saved[0], _saved[1], _NEVER)
            _holding += 1
            _open += 1
            self._holding = self._entered = True
        return self

    def release(self) -> None:
        """The replay is over: full collections as configured, the replay's survivors frozen."""
        global _holding, _saved, _frozen
        with _lock:
            if not self._holding:
                return
            self._holding = False
            _holding -= 1
            if _holding == 0 and _saved is not None:
                if gc.get_threshold()[2] == _NEVER:  # unless someone set other thresholds meanwhile
                    gc.set_threshold(*_saved)
                _saved = None
            # Once per episode (what is frozen stays one snapshot), and only when nothing is frozen
            # yet: objects the operator froze (gc.freeze() before forking workers, say) must stay
            # frozen, and the one unfreeze there is would hand them back too.
            if _holding == 0 and not _frozen and gc.get_freeze_count() == 0:
                gc.freeze()
                _frozen = True

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        global _open, _frozen
        self.release()
        with _lock:
            if not self._entered:
                return
            self._entered = False
            _open -= 1
            if _open == 0 and _frozen:
                gc.unfreeze()
                _frozen = False
