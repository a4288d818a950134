"""Witness a signed checkpoint: submit it to every witness of the policy, keep what they return.

``witness_checkpoint(store, note, settings, clock)``:

1. unless forced, honours the throttle: nothing is sent when the last submission recorded in
   ``@log`` is more recent than ``min_interval`` (the checkpoint stays "not yet witnessed"; the
   next one covers it, since every checkpoint extends the ones before);
2. finds, per witness, the size it last cosigned (the latest ``checkpoint_witnessed`` entries of
   ``@log``; 0 when none: the witness's 409 then says);
3. submits to every witness with a URL at once (``client.WitnessClient``: timeouts, bounded
   retries, 409 re-proving from the witness's size with proofs read from the store's tree);
4. keeps every valid cosignature with the stored checkpoint (``store.add_checkpoint`` merges the
   lines into the note it holds);
5. appends one ``checkpoint_witnessed`` entry per witness to ``@log`` in one durable batch:
   ``{witness, key, size, root, outcome, reason, status?, witness_size?, cosignatures?, detail?}``;
6. evaluates the quorum over all cosignatures the stored checkpoint now carries.

``witness_at_session_end`` is the hook a finished session calls after signing its checkpoint: it
reads the home's settings and never raises, so a run whose witnesses are down still ends with its
verdict, recorded as not (yet) witnessed. Nothing here runs for a home without ``witness.toml``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import httpx2

from truss._clock import Clock
from truss._errors import BundleFormatError, TrussError, VerificationError
from truss.ledger.canonical import number_problem
from truss.ledger.cosignature import checkpoint_of, with_signature_lines
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keyhistory import LOG_SESSION, LogAppender, append_to_log
from truss.ledger.merkle import consistency_proof
from truss.ledger.note import StoredCheckpointLike
from truss.ledger.tlog_policy import Policy, Quorum, cosigned_by, evaluate
from truss.witness.client import Sleep, WitnessClient, WitnessOutcome
from truss.witness.config import WitnessSettings, load_settings

__all__ = ["WitnessReport", "WitnessStore", "witness_at_session_end", "witness_checkpoint"]

_TAIL = 512  # entries of @log read back for the last sizes and the throttle


class WitnessStore(LogAppender, Protocol):
    """What witnessing needs from a ledger store."""

    origin: str

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...

    def tree_size(self) -> int: ...

    def node(self, level: int, index: int) -> bytes: ...

    def checkpoint_covering(self, size: int) -> StoredCheckpointLike | None: ...

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None: ...


@dataclass(frozen=True)
class WitnessReport:
    """What witnessing one checkpoint did. ``skipped`` says why nothing was sent (throttled, no
    witness configured, a config error); ``note`` is the checkpoint with every cosignature kept."""

    size: int
    root: bytes
    note: str
    quorum: Quorum
    outcomes: tuple[WitnessOutcome, ...] = ()
    skipped: str | None = None
    error: str | None = None
    entries: tuple[StoredEntry, ...] = field(default=(), repr=False)

    @property
    def witnessed(self) -> bool:
        return self.quorum.ok

    def summary(self) -> str:
        if self.error:
            return f"checkpoint of size {self.size} not witnessed: {self.error}"
        if self.skipped:
            state = "witnessed" if self.quorum.ok else "not yet witnessed"
            return f"checkpoint of size {self.size} {state} ({self.skipped})"
        parts = [
            f"{o.witness} {o.outcome}" + ("" if o.outcome == "cosigned" else f" ({o.reason})") for o in self.outcomes
        ]
        state = "witnessed" if self.quorum.ok else f"not witnessed: {self.quorum.describe()}"
        return f"checkpoint of size {self.size} {state}; " + ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "root": base64.b64encode(self.root).decode("ascii"),
            "witnessed": self.quorum.ok,
            "quorum": {
                "ok": self.quorum.ok,
                "cosigned": list(self.quorum.cosigned),
                "short": [
                    {"group": s.name, "have": s.have, "need": s.need, "missing": list(s.missing)}
                    for s in self.quorum.short
                ],
            },
            "outcomes": [o.to_json() for o in self.outcomes],
            "skipped": self.skipped,
            "error": self.error,
            "note": self.note,
        }


def _cosigned_names(note: bytes, policy: Policy) -> list[str]:
    try:
        return list(cosigned_by(policy, note))
    except (VerificationError, BundleFormatError):
        return []


def _held_note(store: WitnessStore, size: int, note: bytes) -> bytes:
    held = store.checkpoint_covering(size)
    return held.note.encode("utf-8") if held is not None and held.size == size else note


def _history(store: WitnessStore) -> tuple[dict[str, int], int | None]:
    """Per witness key, the latest size it is known to hold; and when witnesses were last asked."""
    info = store.session(LOG_SESSION)
    if info is None:
        return {}, None
    known: dict[str, int] = {}
    last: int | None = None
    for item in store.read_session(LOG_SESSION, from_seq=max(0, int(info.entries) - _TAIL)):
        if item.kind != "checkpoint_witnessed":
            continue
        body = item.body
        last = item.ts if last is None else max(last, item.ts)
        key, size, theirs = body.get("key"), body.get("size"), body.get("witness_size")
        if not isinstance(key, str):
            continue
        if body.get("outcome") == "cosigned" and isinstance(size, int):
            known[key] = size
        elif body.get("outcome") == "superseded" and isinstance(theirs, int):
            known[key] = theirs
    return known, last


def _record(outcome: WitnessOutcome, key: str, root: bytes) -> Record:
    body: dict[str, Any] = {
        "witness": outcome.witness,
        "key": key,
        "size": outcome.size,
        "root": base64.b64encode(root).decode("ascii"),
        "outcome": outcome.outcome,
        "reason": outcome.reason,
    }
    if outcome.status is not None:
        body["status"] = outcome.status
    # A witness may name any size up to 2**63 - 1; one past I-JSON's range has no canonical form, so
    # it stays in the detail's words only (the outcome and reason already say the witness is ahead).
    if outcome.witness_size is not None and number_problem(outcome.witness_size) is None:
        body["witness_size"] = outcome.witness_size
    if outcome.cosignatures:
        body["cosignatures"] = [line.line().rstrip("\n") for line in outcome.cosignatures]
    if outcome.detail:
        body["detail"] = outcome.detail[:300]
    return Record("checkpoint_witnessed", body)


async def witness_checkpoint(
    store: WitnessStore,
    note: bytes,
    settings: WitnessSettings,
    clock: Clock,
    *,
    throttle: bool = True,
    sleep: Sleep | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> WitnessReport:
    """Submit the signed checkpoint ``note`` of ``store``'s log (see the module docstring)."""
    policy = settings.policy
    checkpoint = checkpoint_of(note)
    known, last = await anyio.to_thread.run_sync(lambda: _history(store))
    held = await anyio.to_thread.run_sync(lambda: _held_note(store, checkpoint.size, note))
    if throttle and last is not None and clock.now_ms() - last < settings.min_interval_ms:
        quorum = evaluate(policy, _cosigned_names(held, policy))
        wait_s = (settings.min_interval_ms - (clock.now_ms() - last)) / 1000
        return WitnessReport(
            checkpoint.size,
            checkpoint.root,
            held.decode(),
            quorum,
            skipped=f"throttled: witnesses were asked less than the minimum interval ago; next in {wait_s:.0f}s",
        )
    tree_size = await anyio.to_thread.run_sync(store.tree_size)

    async def prove(old: int) -> Sequence[bytes]:
        return await anyio.to_thread.run_sync(lambda: consistency_proof(old, checkpoint.size, store.node))

    witnesses = list(policy.witnesses.values())
    outcomes: list[WitnessOutcome | None] = [None] * len(witnesses)
    client = WitnessClient(timeout_s=settings.timeout_s, retries=settings.retries, sleep=sleep, transport=transport)
    async with client:

        async def one(i: int) -> None:
            w = witnesses[i]
            outcomes[i] = await client.submit(
                w, note, checkpoint, known_size=known.get(w.key.vkey, 0), tree_size=tree_size, prove=prove
            )

        async with anyio.create_task_group() as group:
            for i in range(len(witnesses)):
                group.start_soon(one, i)
    done = tuple(o for o in outcomes if o is not None)
    lines = [line for o in done for line in o.cosignatures]
    merged = with_signature_lines(held, lines) if lines else held
    records = [_record(o, w.key.vkey, checkpoint.root) for o, w in zip(done, witnesses, strict=True)]

    def keep() -> tuple[bytes, list[StoredEntry]]:
        if lines:
            store.add_checkpoint(checkpoint.size, checkpoint.root, merged.decode())
        entries = append_to_log(store, records) if records else []
        return _held_note(store, checkpoint.size, merged), entries

    final, entries = await anyio.to_thread.run_sync(keep)
    quorum = evaluate(policy, _cosigned_names(final, policy))
    return WitnessReport(checkpoint.size, checkpoint.root, final.decode(), quorum, done, entries=tuple(entries))


async def witness_at_session_end(
    store: WitnessStore, home: Path, clock: Clock, note: str | None
) -> WitnessReport | None:
    """The session-end hook: witness ``note`` when the home configures witnessing; never raises."""
    if note is None or not (home / "witness.toml").exists():
        return None
    try:
        settings = load_settings(home)
    except TrussError as exc:
        return _failed(note, f"the witness config cannot be used: {exc.message}")
    if settings is None or not settings.at_session_end:
        return None
    try:
        return await witness_checkpoint(store, note.encode("utf-8"), settings, clock)
    except TrussError as exc:
        return _failed(note, exc.message)


def _failed(note: str, why: str) -> WitnessReport | None:
    try:
        checkpoint = checkpoint_of(note.encode("utf-8"))
    except BundleFormatError:
        return None
    return WitnessReport(checkpoint.size, checkpoint.root, note, Quorum(ok=False), error=why)
