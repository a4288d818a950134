"""A long verified read checks its signatures (V10) on another core, in a helper process, with the
same answers: the same entries, the same refusal at the same entry, a correct read when the helper
dies, and no helper left once the read ends (docs/ledger-format.md, section 4.1, R1)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
from collections.abc import Generator, Iterator
from typing import Any, cast

import pytest

import truss._sigcheck as sigcheck
from truss._errors import VerificationError
from truss._sigcheck import ProcessSignatureChecks, process_checks
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.note import sign_checkpoint
from truss.ledger.reader import VerifiedStore
from truss.ledger.stores import LedgerStore, open_store
from truss.runtime import Runtime
from truss.testing import ManualClock

ENTRIES = 2100  # past LONG_SESSION, and four pages of the read

pytestmark = pytest.mark.skipif(os.name != "posix" or (os.cpu_count() or 1) < 2, reason="a helper needs two cores")


def _key() -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(b"signature helper").digest(), "helper.truss.test")


@pytest.fixture(scope="module")
def long_store() -> Iterator[LedgerStore]:
    store = open_store("memory:", key=_key(), clock=ManualClock(), create=True)
    store.append("s_long", [Record("session_started", {"contract": "c"})])
    for i in range(ENTRIES - 1):
        store.append("s_long", [Record("mcp_tool_call", {"call": f"c{i}", "note": "x" * (i % 300)})])
    store.append("s_short", [Record("session_started", {"contract": "c"})])
    sign_checkpoint(store, _key())
    yield store
    store.close()


def _trusted() -> TrustedKeys:
    return TrustedKeys([_key().verifier])


class _Settled:
    """A source of helpers that waits (bounded) for each page's answers, so the read takes them from
    the helper rather than checking them itself: what is tested is then the helper's answers."""

    def __init__(self) -> None:
        self.made: list[ProcessSignatureChecks] = []
        self.pids: list[int] = []

    def __call__(self, entries: int) -> _Waiting | None:
        checks = ProcessSignatureChecks.start()
        if checks is None:
            return None
        self.made.append(checks)
        assert checks.pid is not None
        self.pids.append(checks.pid)
        return _Waiting(checks)


class _Waiting:
    def __init__(self, inner: ProcessSignatureChecks) -> None:
        self.inner = inner

    def submit(self, items: Any, trusted: TrustedKeys) -> None:
        self.inner.submit(items, trusted)
        self.inner.settle(30.0)

    def answer(self, item: StoredEntry) -> bool | None:
        return self.inner.answer(item)

    def close(self) -> None:
        self.inner.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class _Tampered:
    """The store with one entry's signature changed by one bit."""

    def __init__(self, inner: LedgerStore, seq: int) -> None:
        self._inner = inner
        self._seq = seq

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        for item in self._inner.read_session(session, from_seq=from_seq):
            changed = bytes([item.sig[0] ^ 1]) + item.sig[1:]
            yield dataclasses.replace(item, sig=changed) if item.seq == self._seq else item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_long_read_checked_by_the_helper_yields_the_entries_of_a_read_checked_in_process(
    long_store: LedgerStore,
) -> None:
    alone = [item.hash for item in VerifiedStore(long_store, _trusted()).read_session("s_long")]
    source = _Settled()
    helped = [item.hash for item in VerifiedStore(long_store, _trusted(), signatures=source).read_session("s_long")]
    assert helped == alone and len(alone) == ENTRIES
    [checks] = source.made
    assert checks.answered > ENTRIES // 10, "the helper answered for a share of every page"
    assert _gone(source.pids[0]), "the helper is reaped when the read ends"


def test_a_bad_signature_in_a_long_session_is_refused_at_the_same_entry_with_the_helper(
    long_store: LedgerStore,
) -> None:
    tampered = cast(LedgerStore, _Tampered(long_store, 1530))  # in the helper's part of the third page
    with pytest.raises(VerificationError) as alone:
        list(VerifiedStore(tampered, _trusted()).read_session("s_long"))
    source = _Settled()
    with pytest.raises(VerificationError) as helped:
        list(VerifiedStore(tampered, _trusted(), signatures=source).read_session("s_long"))
    assert (helped.value.reason, helped.value.seq) == (alone.value.reason, alone.value.seq) == ("bad_signature", 1530)
    assert source.made[0].answered > 0 and _gone(source.pids[0])


def test_a_helper_killed_in_the_middle_of_a_read_leaves_a_complete_verified_read(long_store: LedgerStore) -> None:
    alone = [item.hash for item in VerifiedStore(long_store, _trusted()).read_session("s_long")]
    source = _Settled()
    read: list[str] = []
    for item in VerifiedStore(long_store, _trusted(), signatures=source).read_session("s_long"):
        read.append(item.hash)
        if len(read) == 700:
            os.kill(source.pids[0], signal.SIGKILL)
    assert read == alone
    assert _gone(source.pids[0])


def test_a_read_given_up_half_way_leaves_no_helper_behind(long_store: LedgerStore) -> None:
    source = _Settled()
    reading = cast(
        Generator[StoredEntry], VerifiedStore(long_store, _trusted(), signatures=source).read_session("s_long")
    )
    for _ in range(600):
        next(reading)
    assert not _gone(source.pids[0])
    reading.close()
    assert _gone(source.pids[0])


def test_a_runtime_checks_a_long_session_in_a_helper_and_a_short_one_in_process(
    long_store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[ProcessSignatureChecks | None] = []
    start = ProcessSignatureChecks.start

    def counted() -> ProcessSignatureChecks | None:
        started.append(start())
        return started[-1]

    monkeypatch.setattr(ProcessSignatureChecks, "start", staticmethod(counted))
    runtime = Runtime(store=long_store, trusted_keys=_trusted(), clock=ManualClock())
    assert len(list(runtime.store.read_session("s_short"))) == 1
    assert started == []
    assert len(list(runtime.store.read_session("s_long"))) == ENTRIES
    assert len(started) == 1 and started[0] is not None and started[0].pid is None
    assert process_checks(sigcheck.LONG_SESSION - 1) is None


LIAR = """
import os
# "verifies" for the first ten frames, each numbered as the answer to the frame after it
os.write(1, bytes((n + 1) << 1 | 1 for n in range(10)))
while os.read(0, 1 << 20):
    pass
"""


def test_a_helper_whose_answers_are_out_of_step_is_not_followed(
    long_store: LedgerStore, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    liar = tmp_path / "liar.py"
    liar.write_text(LIAR, encoding="utf-8")
    monkeypatch.setattr(sigcheck, "_CHILD", liar)
    made: list[ProcessSignatureChecks] = []

    class _Slow(_Waiting):
        def submit(self, items: Any, trusted: TrustedKeys) -> None:
            self.inner.submit(items, trusted)
            self.inner.settle(0.5)  # bounded: the liar never answers them all

    def source(entries: int) -> _Slow | None:
        checks = ProcessSignatureChecks.start()
        if checks is None:
            return None
        made.append(checks)
        return _Slow(checks)

    tampered = cast(LedgerStore, _Tampered(long_store, 5))  # an answer the liar would pass
    with pytest.raises(VerificationError) as refused:
        list(VerifiedStore(tampered, _trusted(), signatures=source).read_session("s_long"))
    assert (refused.value.reason, refused.value.seq) == ("bad_signature", 5)
    assert made[0].answered == 0 and made[0].pid is None
