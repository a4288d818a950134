"""Submitting checkpoints and serving as a witness, in process: the client against the real witness
service (through an httpx2 transport that calls it, no sockets), the throttle, retries without real
waits, the rate limit, and check-and-persist from two connections at once."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.ledger._witness_keys import ORIGIN, log_key
from truss.ledger.cosignature import verify_cosignatures, with_signature_lines
from truss.ledger.entry import Record
from truss.ledger.keyhistory import LOG_SESSION
from truss.ledger.keys import CosignerKey, IdentityKey
from truss.ledger.merkle import MemoryTree, root_at
from truss.ledger.note import (
    NoteSignature,
    format_checkpoint,
    open_checkpoint,
    parse_note,
    sign_checkpoint,
    sign_checkpoint_note,
    sign_note,
)
from truss.ledger.stores import LedgerStore, open_store
from truss.ledger.tlog_policy import parse_policy
from truss.ledger.witness import AddCheckpoint, Submission, check_submission, format_add_checkpoint
from truss.testing import ManualClock
from truss.witness.config import WitnessSettings
from truss.witness.server import Answer, WitnessService
from truss.witness.state import WitnessState, load_dir_config
from truss.witness.submit import witness_checkpoint

pytestmark = pytest.mark.anyio


def _witness_dir(tmp_path: Path, name: str, *, per_minute: int = 600) -> tuple[Path, CosignerKey]:
    directory = tmp_path / name
    directory.mkdir()
    key = CosignerKey.create(directory / "witness.key", f"witness.test/{name}")
    (directory / "config.toml").write_text(
        f'max_per_minute = {per_minute}\n[[log]]\nkeys = ["{log_key().verifier.vkey}"]\n', encoding="utf-8"
    )
    return directory, key


def _service(directory: Path, clock: ManualClock) -> WitnessService:
    return WitnessService(load_dir_config(directory), WitnessState(directory / "state.db"), clock)


def _witness(tmp_path: Path) -> tuple[WitnessService, CosignerKey]:
    """A witness ``w1`` of the log, with its cosigning key, on a manual clock."""
    directory, key = _witness_dir(tmp_path, "w1")
    return _service(directory, ManualClock()), key


def _add_first(service: WitnessService, note: bytes) -> Answer:
    """Submit ``note`` as the first checkpoint of the log the witness sees (old size 0, no proof)."""
    return service.handle("POST", "/add-checkpoint", format_add_checkpoint(AddCheckpoint(0, (), note)))


def _served_checkpoint(service: WitnessService) -> bytes:
    """The checkpoint the witness serves for the log, with its cosignature."""
    held = service.handle("GET", f"/{hashlib.sha256(ORIGIN.encode()).hexdigest()}/checkpoint", b"")
    assert held.status == 200, held.body
    return held.body


def _transport(services: dict[str, WitnessService], *, down: frozenset[str] = frozenset()) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        host = request.url.host
        if host in down:
            raise httpx2.ConnectError("connection refused", request=request)
        answer = services[host].handle(request.method, request.url.path, request.content)
        return httpx2.Response(answer.status, content=answer.body, headers={"content-type": answer.content_type,
                               **dict(answer.headers)})  # fmt: skip

    return httpx2.MockTransport(handle)


def _store(tmp_path: Path, clock: ManualClock, sessions: int = 2) -> LedgerStore:
    store = open_store(tmp_path / "ledger.db", key=log_key(), clock=clock)
    for i in range(sessions):
        records = [Record("session_started", {"contract": "c"}), Record("session_ended", {"status": "pass"})]
        store.append(f"s_{i}", records)
    return store


def _settings(keys: dict[str, CosignerKey], quorum: str, **kw: Any) -> WitnessSettings:
    lines = [f"witness {n} {k.verifier.vkey} http://{n}.invalid" for n, k in keys.items()]
    policy = parse_policy("\n".join([*lines, quorum, ""]), file="test.policy")
    values: dict[str, Any] = {"min_interval_ms": 60_000, "timeout_s": 5.0, "retries": 0, "at_session_end": True}
    values.update(kw)
    return WitnessSettings(policy=policy, source="test", **values)


class _Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_cosignatures_are_kept_with_the_stored_checkpoint_and_each_outcome_is_a_signed_log_entry(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    (d1, k1), (d2, k2) = _witness_dir(tmp_path, "w1"), _witness_dir(tmp_path, "w2")
    transport = _transport({"w1.invalid": _service(d1, clock), "w2.invalid": _service(d2, clock)})
    with closing(_store(tmp_path, clock)) as store:
        note = sign_checkpoint(store, log_key()).note
        assert note is not None
        settings = _settings({"w1": k1, "w2": k2}, "group both all w1 w2\nquorum both")
        report = await witness_checkpoint(store, note, settings, clock, transport=transport)
        assert report.witnessed and [o.outcome for o in report.outcomes] == ["cosigned", "cosigned"]
        [held] = store.checkpoints()
        assert k1.name in held.note and k2.name in held.note
        entries = [e for e in store.read_session(LOG_SESSION) if e.kind == "checkpoint_witnessed"]
        assert [(e.body["witness"], e.body["size"], e.keyid) for e in entries] == [
            ("w1", held.size, log_key().key_id),
            ("w2", held.size, log_key().key_id),
        ]


async def test_a_second_session_end_within_the_interval_submits_nothing_and_says_so(tmp_path: Path) -> None:
    clock = ManualClock()
    (d1, k1) = _witness_dir(tmp_path, "w1")
    transport = _transport({"w1.invalid": _service(d1, clock)})
    settings = _settings({"w1": k1}, "quorum w1")
    with closing(_store(tmp_path, clock)) as store:
        first = sign_checkpoint(store, log_key()).note
        assert first is not None
        assert (await witness_checkpoint(store, first, settings, clock, transport=transport)).witnessed
        store.append("s_9", [Record("session_started", {"contract": "c"})])
        second = sign_checkpoint(store, log_key()).note
        assert second is not None
        clock.advance(10)
        throttled = await witness_checkpoint(store, second, settings, clock, transport=transport)
        assert throttled.skipped is not None and throttled.skipped.startswith("throttled")
        assert not throttled.witnessed and throttled.outcomes == ()
        forced = await witness_checkpoint(store, second, settings, clock, transport=transport, throttle=False)
        assert forced.witnessed, "`truss ledger checkpoint --witness` ignores the throttle"
        clock.advance(61)
        store.append("s_9", [Record("session_ended", {"status": "pass"})])
        third = sign_checkpoint(store, log_key()).note
        assert third is not None
        assert (await witness_checkpoint(store, third, settings, clock, transport=transport)).outcomes != ()


async def test_an_unreachable_witness_is_retried_with_bounded_backoff_and_recorded_unreachable(tmp_path: Path) -> None:
    clock = ManualClock()
    (d1, k1), (_, k2) = _witness_dir(tmp_path, "w1"), _witness_dir(tmp_path, "w2")
    transport = _transport({"w1.invalid": _service(d1, clock)}, down=frozenset({"w2.invalid"}))
    sleeps = _Sleeps()
    settings = _settings({"w1": k1, "w2": k2}, "group both all w1 w2\nquorum both", retries=3)
    with closing(_store(tmp_path, clock)) as store:
        note = sign_checkpoint(store, log_key()).note
        assert note is not None
        report = await witness_checkpoint(store, note, settings, clock, transport=transport, sleep=sleeps)
    outcomes = {o.witness: o for o in report.outcomes}
    assert (outcomes["w2"].outcome, outcomes["w2"].attempts) == ("unreachable", 4)
    assert sleeps.waits == [0.25, 0.5, 1.0], "three waits between four attempts, doubling, capped"
    assert not report.witnessed and report.quorum.short[0].missing == ("w2",)


@pytest.mark.parametrize(
    ("respond", "outcome", "reason"),
    [
        (lambda: httpx2.Response(404), "refused", "unknown_log"),
        (lambda: httpx2.Response(403), "refused", "forbidden"),
        (lambda: httpx2.Response(422), "refused", "inconsistent"),
        (lambda: httpx2.Response(409, content=b"999\n", headers={"content-type": "text/x.tlog.size"}),
         "refused", "witness_ahead"),
        (lambda: httpx2.Response(409, content=b"5\n", headers={"content-type": "text/x.tlog.size"}),
         "superseded", "superseded"),
        # tlog-witness: a 409 naming the checkpoint's own size, once proven from it, is a witness that
        # cosigned another root at that size (a fork), not a witness that keeps moving.
        (lambda: httpx2.Response(409, content=b"2\n", headers={"content-type": "text/x.tlog.size"}),
         "refused", "inconsistent"),
        # A size the ledger cannot record (2**60 is past I-JSON's range): still an outcome, recorded.
        (lambda: httpx2.Response(409, content=b"1152921504606846976\n", headers={"content-type": "text/x.tlog.size"}),
         "refused", "witness_ahead"),
        (lambda: httpx2.Response(200, content="— witness.test/w1 AAAAAAAAAAAAAAAA\n".encode()),
         "refused", "bad_response"),
        (lambda: httpx2.Response(302, headers={"location": "http://elsewhere.invalid/"}), "refused", "bad_response"),
        (lambda: httpx2.Response(503), "unreachable", "unavailable"),
    ],
)  # fmt: skip
async def test_every_answer_of_a_witness_becomes_an_outcome(
    tmp_path: Path, respond: Callable[[], httpx2.Response], outcome: str, reason: str
) -> None:
    clock = ManualClock()
    _, k1 = _witness_dir(tmp_path, "w1")
    transport = httpx2.MockTransport(lambda request: respond())
    with closing(_store(tmp_path, clock, sessions=3)) as store:
        note = sign_checkpoint_note(ORIGIN, 2, root_at(2, store.node), log_key()).note
        assert note is not None
        report = await witness_checkpoint(store, note, _settings({"w1": k1}, "quorum w1"), clock,
                                          transport=transport, sleep=_Sleeps())  # fmt: skip
        recorded = [e.body for e in store.read_session("@log") if e.kind == "checkpoint_witnessed"]
    [result] = report.outcomes
    assert (result.outcome, result.reason) == (outcome, reason)
    assert [(b["outcome"], b["reason"]) for b in recorded] == [(outcome, reason)]


def test_the_rate_limit_answers_429_with_retry_after_and_refills_with_time(tmp_path: Path) -> None:
    clock = ManualClock()
    directory, _ = _witness_dir(tmp_path, "w1", per_minute=2)
    service = _service(directory, clock)
    tree = MemoryTree()
    tree.append(b"a")
    note = sign_checkpoint_note(ORIGIN, 1, tree.root(), log_key()).note
    assert note is not None
    body = format_add_checkpoint(AddCheckpoint(0, (), note))
    assert service.handle("POST", "/add-checkpoint", body).status == 200
    again = format_add_checkpoint(AddCheckpoint(1, (), note))
    assert service.handle("POST", "/add-checkpoint", again).status == 200
    limited = service.handle("POST", "/add-checkpoint", again)
    assert limited.status == 429 and dict(limited.headers)["Retry-After"] == "30"
    clock.advance(30)
    assert service.handle("POST", "/add-checkpoint", again).status == 200
    assert service.handle("GET", "/add-checkpoint", b"").status == 405


def _race(
    barrier: threading.Barrier,
    state: WitnessState,
    submission: Submission,
    key: CosignerKey,
    clock: ManualClock,
    statuses: list[int],
    i: int,
) -> None:
    barrier.wait(timeout=30)
    statuses[i] = state.submit(submission, [key], clock.now_ms)[0]


def test_two_connections_submitting_diverging_trees_at_once_never_both_get_cosigned(tmp_path: Path) -> None:
    clock = ManualClock()
    directory, key = _witness_dir(tmp_path, "w1")
    config = load_dir_config(directory)
    logs = config.trusted()
    for round_ in range(20):
        honest, forked = MemoryTree(), MemoryTree()
        for i in range(round_ + 1):
            honest.append(b"h%d" % i)
            forked.append(b"f%d" % i)
        forked.append(b"extra")
        notes = [sign_checkpoint_note(ORIGIN, t.size, t.root(), log_key()).note for t in (honest, forked)]
        states = [WitnessState(directory / "state.db"), WitnessState(directory / "state.db")]  # two "processes"
        latest = states[0].latest_for(ORIGIN)
        old = 0 if latest is None else latest.size
        barrier = threading.Barrier(2)
        statuses: list[int] = [0, 0]
        submissions = [
            check_submission(format_add_checkpoint(AddCheckpoint(old, (), note or b"")), logs) for note in notes
        ]

        threads = [
            threading.Thread(target=_race, args=(barrier, states[i], submissions[i], key, clock, statuses, i))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for state in states:
            state.close()
        assert statuses.count(200) <= 1, f"round {round_}: both diverging trees were cosigned ({statuses})"


def test_a_witness_follows_every_key_of_a_rotated_log(tmp_path: Path) -> None:
    clock = ManualClock()
    directory = tmp_path / "w"
    directory.mkdir()
    CosignerKey.create(directory / "witness.key", "witness.test/w")
    old, new = log_key(), IdentityKey.from_seed(b"\x09" * 32, ORIGIN)
    (directory / "config.toml").write_text(
        f'[[log]]\nkeys = ["{old.verifier.vkey}", "{new.verifier.vkey}"]\n', encoding="utf-8"
    )
    service = _service(directory, clock)
    tree = MemoryTree()
    tree.append(b"a")
    first = sign_checkpoint_note(ORIGIN, 1, tree.root(), old).note
    tree.append(b"b")
    second = sign_checkpoint_note(ORIGIN, 2, tree.root(), new).note
    assert first is not None and second is not None
    assert _add_first(service, first).status == 200
    proof = tuple(tree.consistency_proof(1, 2))
    answer = service.handle("POST", "/add-checkpoint", format_add_checkpoint(AddCheckpoint(1, proof, second)))
    assert answer.status == 200


def test_a_checkpoint_with_an_extension_line_gets_a_cosignature_over_its_whole_body(tmp_path: Path) -> None:
    # tlog-cosignature: extension lines, when a log writes them, are part of the Ed25519 cosigned
    # message. A cosignature over the body without them verifies on no note the log signed.
    service, key = _witness(tmp_path)
    tree = MemoryTree()
    tree.append(b"a")
    body = format_checkpoint(ORIGIN, 1, tree.root()) + "an extension line of the log\n"
    note = sign_note(body, [log_key()])
    answer = _add_first(service, note)
    assert answer.status == 200
    cosigned = note + answer.body
    assert [c.name for c in verify_cosignatures(cosigned, [key.verifier])] == [key.name]
    held = _served_checkpoint(service)
    assert parse_note(held).text == body
    assert [c.name for c in verify_cosignatures(held, [key.verifier])] == [key.name]


def test_the_served_checkpoint_keeps_only_the_log_signatures_the_witness_verified(tmp_path: Path) -> None:
    # Anyone may submit a log's checkpoint. A line under the log's name by a key the witness does not
    # know (here the key the log rotates to next) is ignored when checking, and must not be kept: a
    # monitor that knows that key would find its signature bad and refuse the note the witness serves.
    service, key = _witness(tmp_path)
    tree = MemoryTree()
    tree.append(b"a")
    note = sign_checkpoint_note(ORIGIN, 1, tree.root(), log_key()).note
    assert note is not None
    upcoming = log_key("the log's next key")
    junk = NoteSignature(ORIGIN, bytes.fromhex(upcoming.key_id), bytes(64))
    poisoned = with_signature_lines(note, [junk])
    assert _add_first(service, poisoned).status == 200
    held = _served_checkpoint(service)
    assert open_checkpoint(held, [log_key().verifier, upcoming.verifier]).size == 1
    assert [c.name for c in verify_cosignatures(held, [key.verifier])] == [key.name]


def test_a_witness_whose_clock_steps_back_never_dates_a_larger_tree_before_a_smaller_one(tmp_path: Path) -> None:
    # A cosignature says "as of this time, this is the largest tree I saw". Dated before an earlier
    # cosignature of a smaller tree, the pair would read as the witness going back in the log.
    directory, key = _witness_dir(tmp_path, "w1")
    logs = load_dir_config(directory).trusted()
    tree = MemoryTree()
    for entry in (b"a", b"b", b"c"):
        tree.append(entry)
    small = sign_checkpoint_note(ORIGIN, 1, tree.root(1), log_key()).note
    large = sign_checkpoint_note(ORIGIN, 3, tree.root(3), log_key()).note
    assert small is not None and large is not None
    with WitnessState(directory / "state.db") as state:
        first = check_submission(format_add_checkpoint(AddCheckpoint(0, (), small)), logs)
        status, [early], _, _ = state.submit(first, [key], lambda: 1_700_000_000_000)
        proof = tuple(tree.consistency_proof(1, 3))
        second = check_submission(format_add_checkpoint(AddCheckpoint(1, proof, large)), logs)
        again, [late], _, _ = state.submit(second, [key], lambda: 1_600_000_000_000)  # the clock stepped back
    assert (status, again) == (200, 200)
    [one] = verify_cosignatures(small + early.line().encode(), [key.verifier])
    [two] = verify_cosignatures(large + late.line().encode(), [key.verifier])
    assert two.timestamp >= one.timestamp
