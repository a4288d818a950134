"""Chain verification: every tampered fixture is caught with its reason; clean ledgers always verify."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from truss._errors import NotFoundError, VerificationError
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.verification import REASONS, check_entries, verify_entries, verify_ledger
from truss.testing import ManualClock, MemoryStore

TAMPERED = Path(__file__).parent / "tampered"
FIXTURES = sorted(TAMPERED.glob("*.json"))


def _load(path: Path) -> tuple[dict[str, Any], list[StoredEntry], TrustedKeys, dict[str, bytes]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    entries = [StoredEntry.from_json(e) for e in data["entries"]]
    blobs = {ref: base64.b64decode(b) for ref, b in data["blobs"].items()}
    return data, entries, TrustedKeys.from_texts(data["trusted"]), blobs


def test_every_attack_named_in_the_issue_has_a_fixture() -> None:
    names = {p.stem for p in FIXTURES}
    assert {
        "flipped_byte_in_body",
        "flipped_byte_in_signature",
        "flipped_byte_in_prev",
        "swapped_entries",
        "removed_from_middle",
        "duplicated_seq",
        "spliced_from_other_session",
        "resigned_with_other_key",
        "changed_blob",
    } <= names


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_tampered_fixture_is_reported_with_its_reason_at_its_seq(path: Path) -> None:
    data, entries, trusted, blobs = _load(path)
    report = verify_entries(entries, trusted, blobs=blobs.get, session=data["session"], origin=data["origin"])
    expect = data["expect"]
    assert report.ok is expect["ok"], report
    if not expect["ok"]:
        assert report.reason == expect["reason"]
        assert report.seq == expect["seq"]
        assert report.reason in REASONS
        with pytest.raises(VerificationError) as info:
            check_entries(entries, trusted, blobs=blobs.get, session=data["session"], origin=data["origin"])
        assert info.value.reason == expect["reason"] and info.value.seq == expect["seq"]


def test_the_key_an_entry_names_for_itself_is_never_trusted() -> None:
    _, entries, _, blobs = _load(TAMPERED / "resigned_with_other_key.json")
    # The attacker's own key verifies its signatures, but only a key the caller trusts counts.
    report = verify_entries(entries, TrustedKeys(), blobs=blobs.get)
    assert not report.ok and report.reason == "untrusted_key"


def test_erased_payloads_are_counted_not_failed() -> None:
    data, entries, trusted, blobs = _load(TAMPERED / "clean_session.json")
    kept = verify_entries(entries, trusted, blobs=blobs.get, session=data["session"])
    erased = verify_entries(entries, trusted, blobs=lambda ref: None, session=data["session"])
    assert kept.ok and kept.blobs_checked == 3
    assert erased.ok and erased.blobs_checked == 0 and erased.blobs_absent == kept.blobs_absent + 3


def _store() -> tuple[MemoryStore, IdentityKey, ManualClock]:
    key = IdentityKey.from_seed(bytes(range(32)), "verify.truss.test")
    clock = ManualClock()
    return MemoryStore(key=key, clock=clock), key, clock


def test_verify_ledger_of_an_unknown_session_is_not_found() -> None:
    store, key, _ = _store()
    with pytest.raises(NotFoundError):
        verify_ledger(store, TrustedKeys([key.verifier]), session="s_nope")


ops = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=4),
        st.sampled_from(["model_turn", "mcp_tool_intent", "mcp_tool_call", "mcp_tool_denied", "session_ended"]),
        st.dictionaries(
            st.text(max_size=5),
            st.none()
            | st.booleans()
            | st.integers(-(2**53 - 1), 2**53 - 1)
            | st.text(max_size=8)
            | st.binary(max_size=16),
            max_size=3,
        ),
        st.integers(min_value=1, max_value=3),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_clean_ledgers_always_verify(script: list[tuple[int, str, dict[str, Any], int]]) -> None:
    from truss.ledger.canonical import sha256_ref

    store, key, clock = _store()
    started: set[str] = set()
    ended: set[str] = set()
    for n, kind, raw_body, batch in script:
        session = f"s_{n}"
        if session in ended:
            continue
        records: list[Record] = []
        if session not in started:
            records.append(Record("session_started", {"contract": f"c{n}"}))
            started.add(session)
        for i in range(batch):
            body: dict[str, Any] = {}
            blobs: dict[str, bytes] = {}
            for k, v in raw_body.items():
                if isinstance(v, bytes):
                    body[k] = sha256_ref(v)
                    blobs[body[k]] = v
                else:
                    body[k] = v
            last = kind == "session_ended" and i == batch - 1
            records.append(Record(kind if last or kind != "session_ended" else "model_turn", body, blobs))
        if kind == "session_ended":
            ended.add(session)
        store.append(session, records, durable=bool(batch % 2))
        clock.advance(0.001)
    trusted = TrustedKeys([key.verifier])
    whole = verify_ledger(store, trusted)
    assert whole.ok, whole
    assert whole.entries == store.tree_size()
    for session in started:
        assert verify_ledger(store, trusted, session=session).ok
    for session in list(started)[:2]:
        store.erase_payloads(session)
    assert verify_ledger(store, trusted).ok
