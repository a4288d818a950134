"""The conformance check every ledger store must pass.

``check_ledger_store(factory)`` runs the behaviours any store (SQLite now, PostgreSQL later) must
show, through the ``LedgerStore`` interface only, and raises ``AssertionError`` naming the first
one that fails. ``factory(key, clock)`` returns a fresh, empty store each time it is called.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from truss._errors import NotFoundError, SessionBusyError, StoreConflictError, StoreError, TrussError
from truss.ledger.canonical import sha256_ref
from truss.ledger.cosignature import cosign, with_signature_lines
from truss.ledger.entry import ZERO_HASH, Record, StoredEntry
from truss.ledger.keys import CosignerKey, IdentityKey, TrustedKeys
from truss.ledger.merkle import MemoryTree, fetched, leaf_hash, root_at, root_nodes
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.stores.base import LeaseOwner, LedgerStore, append_checked
from truss.ledger.verification import verify_ledger
from truss.testing._clock import ManualClock

__all__ = ["StoreFactory", "check_ledger_store"]


# -- conformance ------------------------------------------------------------------------------

StoreFactory = Callable[[IdentityKey, ManualClock], LedgerStore]

_CONFORMANCE_SEED = bytes(range(32))


def check_ledger_store(factory: StoreFactory) -> None:
    """Run every conformance check against fresh stores from ``factory``; ``AssertionError`` on failure."""
    for check in _CHECKS:
        key = IdentityKey.from_seed(_CONFORMANCE_SEED, "conformance.truss.test")
        clock = ManualClock()
        store = factory(key, clock)
        try:
            check(store, key, clock)
        except AssertionError as exc:
            raise AssertionError(f"store conformance: {check.__name__}: {exc}") from exc
        finally:
            store.close()


def _start(contract: str = "demo", principal: Any = None) -> Record:
    body: dict[str, Any] = {"contract": contract}
    if principal is not None:
        body["principal"] = principal
    return Record("session_started", body)


def _expect(error: type[TrussError], fn: Callable[[], object], what: str) -> TrussError:
    try:
        fn()
    except error as exc:
        return exc
    raise AssertionError(f"{what}: expected {error.__name__}")


def _appends_assign_seq_prev_index_ts_and_sign(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    first = store.append("s_a", [_start(), Record("model_turn", {"n": 1})])
    clock.advance(1)
    second = store.append("s_b", [_start("other")])
    third = store.append("s_a", [Record("model_turn", {"n": 2})])
    assert [e.seq for e in first] == [0, 1] and third[0].seq == 2, "seq counts per session from 0"
    assert [e.index for e in first + second + third] == [0, 1, 2, 3], "index counts over the whole log"
    assert first[0].prev == ZERO_HASH and first[1].prev == first[0].hash and third[0].prev == first[1].hash
    assert second[0].ts == first[0].ts + 1000, "ts comes from the injected clock"
    assert all(e.log == store.origin == key.name for e in first), "entries carry the log origin"
    assert all(key.verifier.verify(_payload(e), e.sig) and e.keyid == key.key_id for e in first + second + third)
    read = list(store.read_session("s_a"))
    assert [e.hash for e in read] == [e.hash for e in first + third], "read_session returns what append returned"
    assert [e.raw for e in read] == [e.raw for e in first + third], "stored bytes are the signed bytes"
    assert [e.seq for e in store.read_session("s_a", from_seq=1)] == [1, 2]
    assert [e.index for e in store.read_range(1, 3)] == [1, 2]
    assert list(store.read_session("s_missing")) == []


def _long_sessions_are_read_whole_from_any_seq(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    # Long enough to cross any page size a backend reads with (SQLite and PostgreSQL read a small
    # first page, so that a session's first entry costs a few rows, then larger ones).
    n = 1200
    store.append("s_short", [_start()])
    store.append("s_long", [_start(), *(Record("model_turn", {"n": i}) for i in range(1, n))])
    store.append("s_short", [Record("model_turn", {"n": 1})])
    assert [e.seq for e in store.read_session("s_long")] == list(range(n)), "a long session is read whole"
    for start in (1, 7, 8, 9, 71, 72, 583, 584, 999, 1000, n - 1, n):
        got = [e.seq for e in store.read_session("s_long", from_seq=start)]
        assert got == list(range(start, n)), f"read_session(from_seq={start}) returns the rest of the session"
    first = next(iter(store.read_session("s_long")), None)
    assert first is not None and first.seq == 0 and first.kind == "session_started"
    assert [e.seq for e in store.read_session("s_short")] == [0, 1], "the other session is not mixed in"
    assert [e.index for e in store.read_range(0, n + 2)] == list(range(n + 2)), "a long range is read whole"


def _payload(entry: StoredEntry) -> bytes:
    from truss.ledger.entry import entry_signing_payload

    return entry_signing_payload(entry.raw)


def _sessions_are_listed(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_1", [_start("one", principal={"tenant": "t", "user": "u"})])
    clock.advance(1)
    store.append("s_2", [_start("two")])
    store.append("s_2", [Record("session_ended", {})])
    info = store.session("s_1")
    assert info is not None and info.contract == "one" and info.status == "running" and info.entries == 1
    assert info.principal == {"tenant": "t", "user": "u"}
    two = store.session("s_2")
    assert two is not None and two.ended and two.entries == 2 and two.status == "ended"
    assert two.head == list(store.read_session("s_2"))[-1].hash
    assert [s.id for s in store.sessions()] == ["s_2", "s_1"], "newest first"
    assert [s.id for s in store.sessions(limit=1)] == ["s_2"]
    assert [s.id for s in store.sessions(principal={"user": "u", "tenant": "t"})] == ["s_1"]
    store.append("s_1", [Record("session_suspended", {"reason": "approval"})])
    assert [s.id for s in store.sessions(status="suspended")] == ["s_1"], "the status follows the last entry"
    store.append("s_1", [Record("approval_decided", {"call": "c"})])
    waiting = store.session("s_1")
    assert waiting is not None and waiting.status == "suspended", "a decision leaves the session waiting"
    store.append("s_1", [Record("session_resumed", {})])
    assert [s.id for s in store.sessions(status="running")] == ["s_1"]
    assert store.session("s_nope") is None


def _session_rules_are_enforced(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    _expect(StoreError, lambda: store.append("s_x", [Record("model_turn", {})]), "a session not started")
    store.append("s_x", [_start()])
    _expect(StoreConflictError, lambda: store.append("s_x", [_start()]), "starting a session twice")
    conflict = _expect(
        StoreConflictError,
        lambda: store.append("s_x", [Record("model_turn", {})], expect_seq=5),
        "a stale expect_seq",
    )
    assert conflict.fields.get("session") == "s_x"
    store.append("s_x", [Record("model_turn", {})], expect_seq=1)
    surrogate = _expect(StoreError, lambda: store.append("s_x", [Record("model_turn", {"t": "\ud800"})]), "a surrogate")
    assert surrogate.fields.get("reason") == "bad_body", "a body that cannot be encoded is refused as such"
    store.append("s_x", [Record("session_ended", {})])
    _expect(StoreConflictError, lambda: store.append("s_x", [Record("model_turn", {})]), "appending after the end")
    _expect(StoreError, lambda: store.append("s_x", [Record("no_such_kind", {})]), "an unknown kind")
    info = store.session("s_x")
    assert info is not None and info.entries == 3, "failed appends write nothing"
    assert store.tree_size() == 3


def _blobs_are_content_addressed_and_erasable(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    data, shared = b'{"path":"/srv/a"}', b"shared bytes"
    ref, shared_ref = sha256_ref(data), sha256_ref(shared)
    bad = Record("mcp_tool_intent", {"args": ref}, {ref: b"other bytes"})
    store.append("s_p", [_start()])
    _expect(StoreError, lambda: store.append("s_p", [bad]), "a blob that does not match its ref")
    store.append("s_p", [Record("mcp_tool_intent", {"args": ref, "x": shared_ref}, {ref: data, shared_ref: shared})])
    store.append("s_q", [_start(), Record("mcp_tool_call", {"result": shared_ref}, {shared_ref: shared})])
    assert store.blob(ref) == data and store.blob(shared_ref) == shared
    assert store.blobs_for([ref, shared_ref, sha256_ref(b"absent"), ref]) == {ref: data, shared_ref: shared}
    assert store.erase_payloads("s_p") == 2
    assert store.blob(ref) is None, "erased bytes are gone"
    assert store.blob(shared_ref) == shared, "bytes another session links to stay"
    assert store.erased_refs("s_p") == {ref, shared_ref}
    assert store.erased_refs("s_q") == set()
    trusted = TrustedKeys([key.verifier])
    report = verify_ledger(store, trusted, session="s_p")
    assert report.ok and report.blobs_absent == 1 and report.blobs_checked == 1, f"verifies after erasure: {report}"


def _the_merkle_tree_is_maintained(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    tree = MemoryTree()
    assert store.tree_size() == 0 and store.tree_root() == tree.root()
    for i in range(7):
        entries = store.append(f"s_{i}", [_start(), Record("model_turn", {"i": i})])
        for entry in entries:
            tree.append(entry.raw)
        assert store.tree_head() == (tree.size, tree.root())
    assert store.node(0, 5) == leaf_hash(next(store.read_range(5, 6)).raw)
    assert store.node(3, 0) == tree.nodes[(3, 0)] and store.node(2, 2) == tree.nodes[(2, 2)]
    assert root_at(9, store.node) == tree.root(9), "stored nodes give the root at any earlier size"
    _expect(StoreError, lambda: store.node(4, 0), "a node of a subtree not yet complete")
    wanted = [(0, 5), (3, 0), (2, 2), (0, 13), (1, 6)]
    assert store.nodes(wanted) == {k: tree.nodes[k] for k in wanted}, "many nodes in one lookup"
    assert store.nodes([]) == {}
    assert root_at(11, fetched(store.nodes, root_nodes(11))) == tree.root(11)
    _expect(StoreError, lambda: store.nodes([(0, 1), (4, 0)]), "one node of the lookup not stored")
    backwards = wanted[::-1]  # node_hashes: a proof's nodes for a fold that holds none of them
    assert list(store.node_hashes(iter(backwards))) == [tree.nodes[k] for k in backwards], "streamed in the order asked"
    assert list(store.node_hashes(iter([]))) == []
    for keys in ([(0, 1), (4, 0), (0, 2)], [(0, 1), (4, 0)], [(4, 0)]):
        _expect(StoreError, lambda keys=keys: list(store.node_hashes(iter(keys))), "a streamed node not stored")


def _checkpoints_and_envelopes_are_kept(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_c", [_start()])
    size, root = store.tree_head()
    store.add_checkpoint(size, root, "note text\n")
    store.add_checkpoint(size, root, "note text\n")
    _expect(StoreConflictError, lambda: store.add_checkpoint(size, b"\x00" * 32, "x"), "a second root at one size")
    assert [(c.size, c.root, c.note) for c in store.checkpoints()] == [(1, root, "note text\n")]
    assert store.envelope("s_c") is None
    store.set_envelope("s_c", b'{"payloadType":"x"}')
    assert store.envelope("s_c") == b'{"payloadType":"x"}'
    _expect(NotFoundError, lambda: store.set_envelope("s_none", b"{}"), "an envelope for an unknown session")


def _checkpoints_are_found_by_size(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    assert store.latest_checkpoint() is None and store.checkpoint_covering(0) is None, "no checkpoint yet"
    sizes: list[int] = []
    for i in range(4):  # stored out of order: the lookups go by size, not by when a row was added
        store.append(f"s_k{i}", [_start()])
        store.append(f"s_k{i}", [Record("model_turn", {"n": i})])
        sizes.append(store.tree_size())
    roots = {size: root_at(size, store.node) for size in sizes}
    for size in (sizes[2], sizes[0], sizes[3], sizes[1]):
        store.add_checkpoint(size, roots[size], f"note {size}\n")
    latest = store.latest_checkpoint()
    assert latest is not None and (latest.size, latest.root, latest.note) == (
        sizes[3],
        roots[sizes[3]],
        f"note {sizes[3]}\n",
    ), "the latest checkpoint is the largest"
    for want, expected in [(0, sizes[0]), (sizes[0], sizes[0]), (sizes[0] + 1, sizes[1]), (sizes[3], sizes[3])]:
        found = store.checkpoint_covering(want)
        assert found is not None and found.size == expected, f"the first checkpoint covering {want} entries"
        assert found.root == roots[expected]
    assert store.checkpoint_covering(sizes[3] + 1) is None, "none covers more than the largest"


def _cosignatures_are_kept_with_their_checkpoint(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    store.append("s_w", [_start()])
    size, root = store.tree_head()
    signed = sign_checkpoint_note(store.origin, size, root, key)
    assert signed.note is not None
    store.add_checkpoint(size, root, signed.note.decode())
    witness = CosignerKey.from_seed(b"\x07" * 32, "witness.test/w1")
    line = cosign(signed.text(), witness, 1_700_000_000)
    cosigned = with_signature_lines(signed.note, [line]).decode()
    store.add_checkpoint(size, root, cosigned)
    [held] = [c for c in store.checkpoints() if c.size == size]
    assert held.note == cosigned, "a cosignature returned for a checkpoint is kept with it"
    store.add_checkpoint(size, root, signed.note.decode())
    [held] = [c for c in store.checkpoints() if c.size == size]
    assert held.note == cosigned, "adding the bare checkpoint again loses no cosignature"


def _expect_index_refuses_an_append_elsewhere_in_the_log(
    store: LedgerStore, key: IdentityKey, clock: ManualClock
) -> None:
    store.append("s_i", [_start()])
    size = store.tree_size()
    _expect(
        StoreConflictError,
        lambda: store.append("s_i", [Record("model_turn", {})], expect_index=size + 1),
        "an append whose first entry would not land at the expected log index",
    )
    assert store.tree_size() == size, "nothing is written when the index does not match"
    [entry] = store.append("s_i", [Record("model_turn", {})], expect_index=size)
    assert entry.index == size


def _nothing_follows_a_key_rotation_in_its_own_append(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    from truss.ledger.keyhistory import LOG_SESSION, ensure_log_session, rotation_record

    ensure_log_session(store)
    size = store.tree_size()
    successor = IdentityKey.from_seed(bytes(reversed(_CONFORMANCE_SEED)), key.name)
    error = _expect(
        StoreError,
        lambda: store.append(LOG_SESSION, [rotation_record(key, successor, size + 1), Record("model_turn", {})]),
        "an append holding a record after a key rotation (the retired key would sign it)",
    )
    assert error.fields.get("reason") == "key_retired", error.fields
    assert store.tree_size() == size, "nothing of such an append is written"


def _a_key_its_own_rotation_retired_signs_no_later_append(
    store: LedgerStore, key: IdentityKey, clock: ManualClock
) -> None:
    from truss.ledger.keyhistory import LOG_SESSION, ensure_log_session, rotation_record

    store.append("s_r", [_start()])
    ensure_log_session(store)
    size = store.tree_size()
    successor = IdentityKey.from_seed(bytes(reversed(_CONFORMANCE_SEED)), key.name)
    store.append(LOG_SESSION, [rotation_record(key, successor, size + 1)], expect_index=size)
    _refused_as_retired(store, "an append after the store's key rotated itself away in an earlier append")


def _a_key_a_removal_names_signs_no_later_append(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    """The removal here names the store's own key and is signed by it (a store holds one key), which
    the verifier refuses (only a log key removes, and only a worker key); the store's guard reads the
    key a ``key_removed`` names, not its signer, as for a removal the log key's process appended."""
    from truss.ledger.keyhistory import append_to_log, removal_record

    store.append("s_r", [_start()])
    append_to_log(store, [removal_record(key.verifier)])
    _refused_as_retired(store, "an append after a key_removed statement naming the store's key")


def _refused_as_retired(store: LedgerStore, what: str) -> None:
    size = store.tree_size()
    error = _expect(StoreError, lambda: store.append("s_r", [Record("model_turn", {})]), what)
    assert error.fields.get("reason") == "key_retired", error.fields
    assert store.tree_size() == size, f"{what}: nothing is written"
    assert [e.kind for e in store.read_session("s_r")] == ["session_started"], f"{what}: nothing is written"


def _concurrent_appends_leave_valid_chains(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            store.append(f"s_t{n}", [_start()])
            for i in range(20):
                store.append(f"s_t{n}", [Record("model_turn", {"i": i})], durable=i % 2 == 0)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, f"a writer failed: {errors[0]!r}"
    assert store.tree_size() == 8 * 21
    report = verify_ledger(store, TrustedKeys([key.verifier]))
    assert report.ok and report.entries == 168 and report.sessions == 8, f"{report}"


def _a_session_has_one_owner_and_stale_epochs_are_fenced(
    store: LedgerStore, key: IdentityKey, clock: ManualClock
) -> None:
    # Owners on two other hosts: nothing is assumed about this host's processes.
    first, second = LeaseOwner("own_a", "host-a", 101), LeaseOwner("own_b", "host-b", 202)
    assert store.lease("s_l") is None, "no lease before one is taken"
    lease = store.acquire_lease("s_l", first, ttl_ms=30_000)
    assert (lease.owner, lease.host, lease.pid, lease.epoch) == ("own_a", "host-a", 101, 1)
    assert lease.expires_ms == clock.now_ms() + 30_000
    store.append("s_l", [_start()], epoch=lease.epoch)
    busy = _expect(SessionBusyError, lambda: store.acquire_lease("s_l", second), "a second driver")
    assert busy.fields.get("pid") == 101 and busy.fields.get("host") == "host-a", "the refusal names the owner"
    clock.advance(20)
    lease = store.renew_lease(lease, ttl_ms=30_000)
    clock.advance(20)
    _expect(SessionBusyError, lambda: store.acquire_lease("s_l", second), "a renewed lease still binds")
    clock.advance(31)
    taken = store.acquire_lease("s_l", second, ttl_ms=30_000)
    assert taken.epoch == 2 and taken.owner == "own_b", "an expired lease is taken over with the next epoch"
    stale = _expect(
        StoreConflictError,
        lambda: store.append("s_l", [Record("model_turn", {})], epoch=lease.epoch),
        "an append by the owner that was taken over",
    )
    assert stale.fields.get("reason") == "stale_epoch"
    _expect(StoreConflictError, lambda: store.renew_lease(lease), "renewing a lease taken over")
    store.release_lease(lease)  # the stale owner's release changes nothing
    held = store.lease("s_l")
    assert held is not None and held.epoch == 2 and held.expires_ms > clock.now_ms()
    store.append("s_l", [Record("model_turn", {})], epoch=taken.epoch)
    store.append("s_l", [Record("model_turn", {})])  # an append without an epoch is not fenced
    store.release_lease(taken)
    released = store.lease("s_l")
    assert released is not None and released.expires_ms == 0 and released.epoch == 2, "released, epoch kept"
    again = store.acquire_lease("s_l", first)
    assert again.epoch == 3, "a released lease is taken with the next epoch"
    info = store.session("s_l")
    assert info is not None and info.entries == 3, "the refused append wrote nothing"


def _checked_appends_never_overspend_together(store: LedgerStore, key: IdentityKey, clock: ManualClock) -> None:
    # The reservation transaction of quotas: 12 writers each take one of 5 slots if one is free,
    # deciding on what the store holds; exactly 5 succeed whatever the interleaving.
    errors: list[BaseException] = []
    taken: list[int] = []

    def writer(n: int) -> None:
        seen: list[StoredEntry] = []

        def decide(fresh: list[StoredEntry], seq: int) -> list[Record]:
            seen.extend(fresh)
            if sum(1 for e in seen if e.kind == "model_turn") >= 5:
                return []
            start = [_start()] if seq == 0 else []
            return [*start, Record("model_turn", {"writer": n})]

        try:
            if append_checked(store, "@slots", decide):
                taken.append(n)
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, f"a checked writer failed: {errors[0]!r}"
    entries = list(store.read_session("@slots"))
    assert len(taken) == 5, f"{len(taken)} checked writers took a slot, not 5"
    assert sorted(e.body["writer"] for e in entries if e.kind == "model_turn") == sorted(taken)


_CHECKS: list[Callable[[LedgerStore, IdentityKey, ManualClock], None]] = [
    _appends_assign_seq_prev_index_ts_and_sign,
    _long_sessions_are_read_whole_from_any_seq,
    _sessions_are_listed,
    _session_rules_are_enforced,
    _blobs_are_content_addressed_and_erasable,
    _the_merkle_tree_is_maintained,
    _checkpoints_and_envelopes_are_kept,
    _checkpoints_are_found_by_size,
    _cosignatures_are_kept_with_their_checkpoint,
    _expect_index_refuses_an_append_elsewhere_in_the_log,
    _nothing_follows_a_key_rotation_in_its_own_append,
    _a_key_its_own_rotation_retired_signs_no_later_append,
    _a_key_a_removal_names_signs_no_later_append,
    _concurrent_appends_leave_valid_chains,
    _a_session_has_one_owner_and_stale_epochs_are_fenced,
    _checked_appends_never_overspend_together,
]
