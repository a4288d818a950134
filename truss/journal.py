"""The journal: one session's records appended in order, and what a resumed run finds recorded.

``Journal.append`` writes records through the store (durable or not) and indexes what it wrote;
built over the entries recorded before (a resumed run), it indexes those too: model turns by
number, and per call id the ``RecordedCall`` slots a resumed gate consults (approval, denial,
intent, result, in doubt, resolution, pending, signal).

Memory stays flat over a long run: a recorded turn is dropped once the loop replayed it, a call's
slots once the gate settled the call (``release``: a call id is never asked again in a leg), and
a live turn is never indexed (turn numbers only grow). The journal keeps every entry only when
built with ``keep_entries`` (a reviewer panel reads the whole record); otherwise it keeps the
head, the next seq and the last ``verdict`` entry, and hands every entry, recorded or appended,
to its ``fold`` (the verdict's done checks, folded as the run goes: ``truss.verdict.VerdictFold``).

Replay matching also lives here: a resumed run's request must be the recorded one (same tool, same
recorded arguments), else ``ReplayDivergenceError`` says which entry and what differs; a payload
the record needs but that was erased is a divergence too; an intent without a result, for a tool
not declared safe to re-send, is recorded ``in_doubt`` and raises ``InDoubtError``.

What this module does not do: decide anything about a call (the gate does) or read the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread

from truss._errors import InDoubtError, ReplayDivergenceError, VerificationError
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.verification import chain_link

__all__ = ["IN_FLIGHT", "EntryFold", "Journal", "JournalStore", "RecordedCall"]


class EntryFold(Protocol):
    """What the journal hands each entry to, in seq order, recorded ones first."""

    def add(self, entry: StoredEntry) -> None: ...


class JournalStore(Protocol):
    """What the journal needs of a store: appending, reading payloads back, and the reads the
    gate's cross-run memo makes through it (every ``truss.ledger.stores.LedgerStore`` is one;
    replay's read-only view is one too)."""

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        epoch: int | None = None,
    ) -> list[StoredEntry]: ...

    def blob(self, ref: str) -> bytes | None: ...

    def tree_size(self) -> int: ...

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...


@dataclass
class RecordedCall:
    """What a session's record holds for one call id (for replay on resume)."""

    call: str
    requested: StoredEntry | None = None  # approval_requested
    decided: StoredEntry | None = None  # approval_decided
    denied: StoredEntry | None = None  # mcp_tool_denied
    intent: StoredEntry | None = None  # mcp_tool_intent
    result: StoredEntry | None = None  # mcp_tool_call
    in_doubt: StoredEntry | None = None
    resolved: StoredEntry | None = None  # in_doubt_resolved
    pending: StoredEntry | None = None  # mcp_tool_pending (a signal or an MCP task)
    signal: StoredEntry | None = None  # signal_received
    last: StoredEntry | None = None  # the latest of the above


_CALL_SLOTS = {
    "approval_requested": "requested",
    "approval_decided": "decided",
    "mcp_tool_denied": "denied",
    "mcp_tool_intent": "intent",
    "mcp_tool_call": "result",
    "in_doubt": "in_doubt",
    "in_doubt_resolved": "resolved",
    "mcp_tool_pending": "pending",
    "signal_received": "signal",
}


class _InFlight:
    """How many calls of this process are between their intent and their result (all runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, delta: int) -> None:
        with self._lock:  # runs may live on several event loops (threads) of one process
            self.count += delta


IN_FLIGHT = _InFlight()


class Journal:
    """Appends one session's records, in order, and indexes the entries recorded before (resume).

    Where ``append`` runs the store's (synchronous, thread-safe, group-committing) ``append``:

    - on the event loop itself when the write needs no fsync, or when no other call is in flight
      in this process (``IN_FLIGHT``, over all runs: serve-mcp runs many at once): a thread
      hand-off costs more than such a write, and on a loaded machine several times more
      (docs/benchmarks.md, bench/gate.py);
    - in a worker thread when other calls are in flight, so their intents and results queue in the
      store together and share fsyncs (group commit) while the loop serves the others.

    Either way the write is never abandoned: a cancelled run still finishes the write it started,
    so there is never a half-recorded step. Blobs are scrubbed of secrets by the caller.
    """

    def __init__(
        self,
        store: JournalStore,
        session: str,
        *,
        recorded: Iterable[StoredEntry] = (),
        chained: bool = False,
        epoch: int | None = None,
        keep_entries: bool = True,
        fold: EntryFold | None = None,
    ) -> None:
        self.store = store
        self.session = session
        # The lease epoch of the run that drives the session: every append carries it, so the
        # store refuses this journal's writes once another process took the session over.
        self.epoch = epoch
        self.calls: dict[str, RecordedCall] = {}
        self.turns: dict[int, StoredEntry] = {}
        self._entries: list[StoredEntry] | None = [] if keep_entries else None
        self.fold = fold
        self.head: StoredEntry | None = None
        self.verdict: StoredEntry | None = None  # the last ``verdict`` entry (a run killed while sealing)
        self.denials = 0
        # Called once the loop has replayed the last recorded model turn (the resume's collector
        # window ends there: truss._collector); None when nothing waits for it.
        self.on_replayed: Callable[[], None] | None = None
        self.extend(recorded, chained=chained)

    def replayed_turn(self, number: int) -> StoredEntry | None:
        """The recorded model turn ``number``, taken out of the record (replayed once, not kept)."""
        recorded = self.turns.pop(number, None)
        if recorded is not None and not self.turns and self.on_replayed is not None:
            done, self.on_replayed = self.on_replayed, None
            done()
        return recorded

    @property
    def entries(self) -> list[StoredEntry]:
        """Every entry of the session so far (a journal built with ``keep_entries`` only)."""
        if self._entries is None:
            raise RuntimeError(f"the journal of session {self.session} does not keep its entries")
        return self._entries

    @property
    def keeps_entries(self) -> bool:
        return self._entries is not None

    @property
    def next_seq(self) -> int:
        return self.head.seq + 1 if self.head is not None else 0

    def extend(self, recorded: Iterable[StoredEntry], *, chained: bool = False) -> None:
        """Index entries recorded before (a resumed run's, or ones a cancelled step committed). Each
        must chain to the head held (the first to the journal's head, the next to it...): what was
        read after the head is refused (``VerificationError``) unless it continues that very chain.

        ``chained``: ``recorded`` is a whole session from its first entry as the verified reader
        yielded it (R1 checked these very entries for V4, V6 and V7, as ``chain_link`` would), given
        to a journal that holds no head yet: they are indexed without hashing each again."""
        if chained and self.head is None:
            for entry in recorded:
                self._index(entry, live=False)
            return
        for entry in recorded:
            finding = chain_link(self.head, entry)
            if finding is not None:
                reason, message = finding
                raise VerificationError(
                    f"session {self.session}: {message}",
                    remedy="do not trust this record; compare it with a bundle or checkpoint you hold",
                    session=self.session,
                    seq=entry.entry.get("seq"),
                    index=entry.entry.get("index"),
                    reason=reason,
                )
            self._index(entry, live=False)

    def release(self, call: str) -> None:
        """Forget what the record holds for ``call`` once it is settled (a result or a denial): the
        gate asks for a call id only while it runs that call."""
        recorded = self.calls.get(call)
        if recorded is not None and (recorded.result is not None or recorded.denied is not None):
            del self.calls[call]

    def _index(self, entry: StoredEntry, *, live: bool) -> None:
        if self._entries is not None:
            self._entries.append(entry)
        self.head = entry
        if self.fold is not None:
            self.fold.add(entry)
        kind = entry.kind
        body: Mapping[str, Any] = entry.body
        if kind == "model_turn" and not live:
            self.turns[int(body["turn"])] = entry
        elif kind == "verdict":
            self.verdict = entry
        slot = _CALL_SLOTS.get(kind)
        if slot is not None:
            call = str(body["call"])
            recorded = self.calls.setdefault(call, RecordedCall(call))
            setattr(recorded, slot, entry)
            recorded.last = entry
        if kind == "mcp_tool_denied":
            self.denials += 1

    def _write(self, records: Sequence[Record], durable: bool, expect_seq: int | None) -> list[StoredEntry]:
        if self.epoch is None:
            return self.store.append(self.session, records, durable=durable, expect_seq=expect_seq)
        return self.store.append(self.session, records, durable=durable, expect_seq=expect_seq, epoch=self.epoch)

    async def append(self, *records: Record, durable: bool = True, expect_seq: int | None = None) -> list[StoredEntry]:
        if not durable or IN_FLIGHT.count <= 1:
            stored = self._write(list(records), durable, expect_seq)
            # Still a point where the run can be cancelled, without a trip through the event loop
            # (a full checkpoint is one more loop iteration per entry, ~5% of a fast call).
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:
            stored = await anyio.to_thread.run_sync(self._write, list(records), durable, expect_seq)
        for entry in stored:
            self._index(entry, live=True)
        return stored

    def blob(self, ref: str) -> bytes | None:
        return self.store.blob(ref)

    # -- replay matching ---------------------------------------------------------------------

    def match(self, call: str, tool: str, stored_args: Mapping[str, Any] | None, entry: StoredEntry) -> None:
        """Refuse a resumed request that is not the recorded one (tool and recorded arguments)."""
        body: Mapping[str, Any] = entry.body
        args_ref = sha256_ref(canonical(dict(stored_args))) if stored_args is not None else None
        if body.get("tool") != tool or body.get("args") != args_ref:
            raise self.divergence(call, entry, f"{tool} with arguments {args_ref}")

    def divergence(self, call: str, entry: StoredEntry | None, actual: str) -> ReplayDivergenceError:
        body: Mapping[str, Any] = entry.body if entry is not None else {}
        expected = f"{entry.kind if entry else '?'} {body.get('tool')} with arguments {body.get('args')}"
        return ReplayDivergenceError(
            f"resumed session {self.session} asked for {actual} as call {call}, but the ledger recorded {expected}",
            remedy="The run no longer matches its record; nothing was called. Start a new run",
            session=self.session,
            seq=entry.seq if entry else None,
            expected=expected,
            actual=actual,
        )

    def payload(self, call: str, entry: StoredEntry, ref: Any, *, what: str | None = None) -> bytes:
        """The recorded payload ``ref`` of ``entry``; erased (``truss ledger erase``) is a divergence."""
        data = self.blob(str(ref))
        if data is not None:
            return data
        if what is not None:
            message = f"call {call} of session {self.session} was recorded, but its {what} was erased"
        else:
            message = (
                f"call {call} of session {self.session}: the payload recorded in entry {entry.seq} "
                f"({entry.kind}) was erased"
            )
        raise ReplayDivergenceError(
            message,
            remedy="A session whose payloads were erased cannot be resumed; start a new run",
            session=self.session,
            seq=entry.seq,
            expected=f"{what} payload" if what is not None else "payload " + str(ref),
            actual="erased",
        )

    async def in_doubt(self, call: str, tool: str, recorded: RecordedCall) -> None:
        """Record (once) that ``call`` was sent without a recorded result, and raise ``InDoubtError``."""
        if recorded.in_doubt is None:
            intent = recorded.intent.seq if recorded.intent else None
            await self.append(Record("in_doubt", {"call": call, "tool": tool, "intent": intent}), durable=True)
        raise InDoubtError(
            f"call {call} ({tool}) of session {self.session} was sent but its result "
            "was never recorded, and the tool is not declared safe to re-send",
            remedy=f"Find out whether it happened, then run 'truss resolve {self.session} {call}' "
            "with --result JSON, --failed or --not-sent, and resume",
            session=self.session,
            call=call,
            tool=tool,
            reason="in_doubt",
        )
