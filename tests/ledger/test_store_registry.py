"""Stores by URL scheme: every registered backend passes the conformance check through ``open_store``,
a toy backend registered from a test passes it too, and a ``--db`` that names no known store is refused."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from truss._clock import Clock
from truss._errors import KeyFileError, NotFoundError, StoreConflictError, StoreError, UsageError
from truss.ledger.canonical import canonical
from truss.ledger.cosignature import merge_notes
from truss.ledger.entry import Record, StoredEntry, encode_record, session_status
from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import Frontier, leaf_hash
from truss.ledger.stores import (
    LedgerStore,
    open_store,
    redact_url,
    register_store,
    store_scheme,
    store_schemes,
    unregister_store,
)
from truss.ledger.stores.base import (
    DEFAULT_LEASE_MS,
    Lease,
    LeaseOwner,
    SessionHead,
    SessionInfo,
    StoredCheckpoint,
    check_epoch,
    grant_lease,
    key_retired_error,
    nodes_in_order,
    retires,
    seal_batch,
)
from truss.ledger.stores.sqlite import SqliteStore, sqlite_path
from truss.testing import ManualClock, check_ledger_store

KEY = IdentityKey.from_seed(bytes(range(32)), "registry.truss.test")

# How the conformance run below makes a fresh, empty store of each registered scheme. A backend
# registered without an entry here fails `test_every_registered_scheme_is_covered_by_a_conformance_run`.
_FRESH: dict[str, Callable[[Path, int], str]] = {
    "sqlite": lambda tmp, n: f"sqlite://{tmp / f'l{n}.db'}",
    "memory": lambda tmp, n: "memory:",
}


# Schemes whose fresh ledger is a new schema of the test PostgreSQL server (tests/_services/postgres.py).
_ON_SERVER = {"postgresql", "postgres"}


def test_every_registered_scheme_is_covered_by_a_conformance_run() -> None:
    assert set(store_schemes()) == set(_FRESH) | _ON_SERVER


@pytest.mark.parametrize("scheme", sorted(set(_FRESH) | _ON_SERVER))
def test_every_registered_store_passes_the_conformance_check_through_open_store(
    scheme: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    numbers = count()
    fresh: Callable[[], str] = lambda: _FRESH[scheme](tmp_path, next(numbers))  # noqa: E731
    if scheme in _ON_SERVER:
        schema: Callable[[], str] = request.getfixturevalue("postgres_urls")
        fresh = lambda: schema().replace("postgresql://", f"{scheme}://", 1)  # noqa: E731
    check_ledger_store(lambda key, clock: open_store(fresh(), key=key, clock=clock))


def test_a_bare_path_and_a_sqlite_url_open_the_same_ledger(tmp_path: Path) -> None:
    clock = ManualClock()
    with closing(open_store(tmp_path / "l.db", key=KEY, clock=clock)) as store:
        store.append("s_1", [Record("session_started", {"contract": "c"})])
    for url in (str(tmp_path / "l.db"), f"sqlite://{tmp_path / 'l.db'}", f"SQLite://{tmp_path / 'l.db'}"):
        with closing(open_store(url, key=None, clock=clock, create=False)) as store:
            assert isinstance(store, SqliteStore) and [s.id for s in store.sessions()] == ["s_1"]


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("ledger.db", "ledger.db"),
        ("/srv/truss/ledger.db", "/srv/truss/ledger.db"),
        ("sqlite:///srv/truss/ledger.db", "/srv/truss/ledger.db"),
        ("sqlite:relative/ledger.db", "relative/ledger.db"),
        ("sqlite:///srv/with%20space.db", "/srv/with space.db"),
        ("./odd:name.db", "odd:name.db"),
    ],
)
def test_sqlite_urls_name_files_as_rfc_3986_reads_them(url: str, path: str) -> None:
    assert sqlite_path(url) == Path(path)
    assert store_scheme(url) == "sqlite"


@pytest.mark.parametrize(
    "url", ["sqlite://db.example.com/ledger.db", "sqlite:///l.db?mode=ro", "sqlite:///l.db#x", "sqlite:", "sqlite://"]
)
def test_a_sqlite_url_with_a_host_a_query_or_no_file_is_refused_not_ignored(url: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        open_store(url, key=KEY, clock=ManualClock())


def test_an_unknown_scheme_is_a_usage_error_that_lists_the_known_ones_and_hides_credentials() -> None:
    with pytest.raises(UsageError) as caught:
        open_store("mysql://truss:hunter2@db.example.com/ledger", key=KEY, clock=ManualClock())
    assert caught.value.fields["scheme"] == "mysql"
    assert "hunter2" not in caught.value.diagnostics()
    for known in ("sqlite:", "memory:", "postgresql:"):
        assert known in caught.value.diagnostics()


def test_redact_url_hides_user_info_and_leaves_paths_alone() -> None:
    assert redact_url("postgresql://u:pw@host/db") == "postgresql://u:***@host/db"
    assert redact_url("/srv/a@b/ledger.db") == "/srv/a@b/ledger.db"


def test_the_memory_store_is_new_each_time_and_refuses_what_it_cannot_be() -> None:
    clock = ManualClock()
    first = open_store("memory:", key=KEY, clock=clock)
    first.append("s_1", [Record("session_started", {})])
    assert open_store("memory:", key=KEY, clock=clock).session("s_1") is None
    with pytest.raises(NotFoundError):
        open_store("memory:", key=KEY, clock=clock, create=False)
    with pytest.raises(KeyFileError):
        open_store("memory:", key=None, clock=clock)
    with pytest.raises(UsageError):
        open_store("memory:shared", key=KEY, clock=clock)


def test_a_taken_scheme_is_refused_unless_replaced_and_a_built_in_one_comes_back() -> None:
    with pytest.raises(UsageError):
        register_store("sqlite", _open_toy)
    register_store("sqlite", _open_toy, replace=True)
    try:
        assert isinstance(open_store("/nowhere/l.db", key=KEY, clock=ManualClock()), ToyStore)
    finally:
        unregister_store("sqlite")
    assert "sqlite" in store_schemes()
    with pytest.raises(UsageError):
        register_store("not a scheme", _open_toy)


# -- a toy backend, registered from this test -----------------------------------------------------


class ToyStore:
    """A key-value backend: every row is bytes or JSON text, read back by parsing, as a remote store would.

    It shares nothing with the built-in stores but the rules every backend applies (``seal_batch``,
    ``retires``) and the Merkle frontier; the conformance check is what says it is a ledger store.
    """

    def __init__(self, key: IdentityKey, clock: Clock) -> None:
        self.origin = key.name
        self._key, self._clock = key, clock
        self._lock = threading.Lock()
        self._rows: dict[str, bytes] = {}  # "entry/<index>", "session/<id>", "blob/<ref>", "node/<l>/<i>", ...
        self._frontier = Frontier()

    def _get(self, name: str) -> bytes | None:
        return self._rows.get(name)

    def _json(self, name: str) -> Any:
        import json

        raw = self._rows.get(name)
        return None if raw is None else json.loads(raw)

    def acquire_lease(self, session: str, owner: LeaseOwner, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        with self._lock:
            lease = grant_lease(self.lease(session), session, owner, self._clock.now_ms(), ttl_ms)
            self._put(f"lease/{session}", dataclasses.asdict(lease))
            return lease

    def renew_lease(self, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_MS) -> Lease:
        with self._lock:
            check_epoch(lease.session, self.lease(lease.session), lease.epoch)
            renewed = dataclasses.replace(lease, expires_ms=self._clock.now_ms() + ttl_ms)
            self._put(f"lease/{lease.session}", dataclasses.asdict(renewed))
            return renewed

    def release_lease(self, lease: Lease) -> None:
        with self._lock:
            held = self.lease(lease.session)
            if held is not None and held.epoch == lease.epoch:
                self._put(f"lease/{lease.session}", dataclasses.asdict(dataclasses.replace(held, expires_ms=0)))

    def lease(self, session: str) -> Lease | None:
        row = self._json(f"lease/{session}")
        return None if row is None else Lease(**row)

    def _put(self, name: str, value: Any) -> None:
        self._rows[name] = value if isinstance(value, bytes) else canonical(value)

    def append(
        self,
        session: str,
        records: Sequence[Record],
        *,
        durable: bool = True,
        expect_seq: int | None = None,
        expect_index: int | None = None,
        epoch: int | None = None,
    ) -> list[StoredEntry]:
        bodies = [encode_record(r) for r in records]
        if not records:
            return []
        with self._lock:
            if self._get("retired") is not None:
                raise key_retired_error("toy:", self._key.key_id)
            check_epoch(session, self.lease(session), epoch)
            row = self._json(f"session/{session}")
            head = None if row is None else SessionHead(row["entries"], row["head"], row["ended"])
            out = seal_batch(self._key, origin=self.origin, session=session, head=head, records=records,
                             bodies=bodies, index=self._frontier.size, now_ms=self._clock.now_ms,
                             expect_seq=expect_seq, expect_index=expect_index)  # fmt: skip
            if retires(self._key, records):
                self._put("retired", b"")
            for record, entry in zip(records, out, strict=True):
                self._put(f"entry/{entry.index}", entry.to_json())
                self._put(f"raw/{entry.index}", entry.raw)
                for level, index, digest in self._frontier.append(leaf_hash(entry.raw)):
                    self._put(f"node/{level}/{index}", digest)
                for ref, data in record.blobs.items():
                    self._rows.setdefault(f"blob/{ref}", bytes(data))
                    self._put(f"link/{session}/{ref}", b"")
            ended = out[-1].kind == "session_ended"
            if row is None:
                contract, principal = records[0].body.get("contract"), records[0].body.get("principal")
                row = {"contract": contract if isinstance(contract, str) else None, "principal": principal,
                       "status": "running", "started_ms": out[0].ts}  # fmt: skip
            status = session_status(session, out[-1].kind, out[-1].body)
            row.update(entries=out[-1].seq + 1, head=out[-1].hash, ended=ended, updated_ms=out[-1].ts, status=status)
            self._put(f"session/{session}", row)
            return out

    def session(self, session: str) -> SessionInfo | None:
        row = self._json(f"session/{session}")
        if row is None:
            return None
        return SessionInfo(session, row["contract"], row["status"], row["entries"], row["started_ms"],
                           row["updated_ms"], row["head"], row["principal"], row["ended"])  # fmt: skip

    def sessions(
        self, *, status: str | None = None, limit: int | None = None, principal: Any = None
    ) -> list[SessionInfo]:
        names = [n.removeprefix("session/") for n in list(self._rows) if n.startswith("session/")]
        rows = [info for n in names if (info := self.session(n)) is not None]
        rows = [r for r in rows if status is None or r.status == status]
        rows = [r for r in rows if principal is None or canonical(r.principal) == canonical(principal)]
        rows.sort(key=lambda r: (r.started_ms, r.id), reverse=True)
        return rows[: max(0, limit)] if limit is not None else rows

    def _entry(self, index: int) -> StoredEntry:
        stored = StoredEntry.from_json(self._json(f"entry/{index}"))
        raw = self._get(f"raw/{index}")
        assert raw is not None
        return StoredEntry.from_raw(raw, stored.sig, stored.keyid, stored.hash)

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        for index in range(self._frontier.size):
            entry = self._entry(index)
            if entry.session == session and entry.seq >= from_seq:
                yield entry

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]:
        for index in range(max(0, start), min(stop, self._frontier.size)):
            yield self._entry(index)

    def blob(self, ref: str) -> bytes | None:
        return self._get(f"blob/{ref}")

    def blobs_for(self, refs: Iterable[str]) -> dict[str, bytes]:
        return {ref: data for ref in set(refs) if (data := self.blob(ref)) is not None}

    def erased_refs(self, session: str) -> set[str]:
        return {n.split("/", 2)[2] for n in list(self._rows) if n.startswith(f"erased/{session}/")}

    def erase_payloads(self, session: str) -> int:
        with self._lock:
            if self._get(f"session/{session}") is None:
                raise NotFoundError(f"no session {session!r}", what="session", name=session)
            mine = [n.split("/", 2)[2] for n in list(self._rows) if n.startswith(f"link/{session}/")]
            fresh = 0
            for ref in mine:
                del self._rows[f"link/{session}/{ref}"]
                fresh += f"erased/{session}/{ref}" not in self._rows
                self._put(f"erased/{session}/{ref}", b"")
                if not any(n.startswith("link/") and n.endswith("/" + ref) for n in self._rows):
                    self._rows.pop(f"blob/{ref}", None)
            return fresh

    def tree_size(self) -> int:
        return self._frontier.size

    def tree_root(self) -> bytes:
        return self._frontier.root()

    def tree_head(self) -> tuple[int, bytes]:
        with self._lock:
            return self._frontier.size, self._frontier.root()

    def node(self, level: int, index: int) -> bytes:
        found = self._get(f"node/{level}/{index}")
        if found is None:
            raise StoreError(f"Merkle node ({level}, {index}) is not stored", level=level, index=index)
        return found

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return {(level, index): self.node(level, index) for level, index in keys}

    def node_hashes(self, keys: Iterable[tuple[int, int]]) -> Iterator[bytes]:
        return nodes_in_order(self.nodes, keys)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        with self._lock:
            held = self._json(f"checkpoint/{size:020d}")
            if held is not None and bytes.fromhex(held["root"]) != root:
                raise StoreConflictError(f"a checkpoint of size {size} with another root is stored", size=size)
            if held is None:
                self._put(f"checkpoint/{size:020d}", {"root": root.hex(), "note": note, "ms": self._clock.now_ms()})
            else:  # witnesses' cosignatures returned for the checkpoint held are kept with it
                self._put(f"checkpoint/{size:020d}", {**held, "note": merge_notes(held["note"], note)})

    def checkpoints(self) -> list[StoredCheckpoint]:
        names = sorted(n for n in list(self._rows) if n.startswith("checkpoint/"))
        rows = [(int(n.split("/")[1]), self._json(n)) for n in names]
        return [StoredCheckpoint(size, bytes.fromhex(r["root"]), r["note"], r["ms"]) for size, r in rows]

    def latest_checkpoint(self) -> StoredCheckpoint | None:
        held = self.checkpoints()  # a toy: its keys are not an index
        return held[-1] if held else None

    def checkpoint_covering(self, size: int) -> StoredCheckpoint | None:
        return next((cp for cp in self.checkpoints() if cp.size >= size), None)

    def set_envelope(self, session: str, envelope: bytes) -> None:
        if self._get(f"session/{session}") is None:
            raise NotFoundError(f"no session {session!r}", what="session", name=session)
        self._put(f"envelope/{session}", bytes(envelope))

    def envelope(self, session: str) -> bytes | None:
        return self._get(f"envelope/{session}")

    def close(self) -> None:
        return None


def _open_toy(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> LedgerStore:
    if key is None:
        raise KeyFileError("the toy store needs a key")
    return ToyStore(key, clock)


@pytest.fixture
def toy_scheme() -> Iterator[str]:
    register_store("toy", _open_toy)
    try:
        yield "toy"
    finally:
        unregister_store("toy")


def test_a_toy_store_registered_under_a_test_scheme_passes_the_conformance_check(toy_scheme: str) -> None:
    assert toy_scheme in store_schemes()
    check_ledger_store(lambda key, clock: open_store(f"{toy_scheme}:anything", key=key, clock=clock))


def test_the_toy_store_is_a_ledger_store_by_the_protocol(toy_scheme: str) -> None:
    store = open_store("TOY:", key=KEY, clock=ManualClock())
    assert isinstance(store, ToyStore) and isinstance(store, LedgerStore)
    assert store.tree_head() == (0, Frontier().root()) and store.session("s") is None
