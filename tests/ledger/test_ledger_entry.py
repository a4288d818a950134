"""Entries: golden vectors (a fixed-seed key, canonical bytes, hashes, signatures) and the fast encoder."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss._errors import BundleFormatError, StoreError
from truss.ledger.canonical import (
    CanonicalError,
    _reference,  # pyright: ignore[reportPrivateUsage]
    canonical,
    sha256_ref,
)
from truss.ledger.entry import (
    KINDS,
    PAYLOAD_TYPE,
    Record,
    StoredEntry,
    check_record,
    entry_bytes,
    iter_refs,
    pae,
    refs_in,
    seal,
)
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.merkle import MemoryTree
from truss.ledger.verification import verify_entries

GOLDEN = Path(__file__).parent / "vectors" / "entry" / "golden_session.json"


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_golden_entries_reproduce_byte_for_byte_from_the_fixed_seed_key() -> None:
    golden = _golden()
    key = IdentityKey.from_seed(bytes.fromhex(golden["key"]["seed_hex"]), golden["key"]["name"])
    assert key.verifier.vkey == golden["key"]["vkey"]
    assert key.key_id == golden["key"]["key_id"]
    tree = MemoryTree()
    for vector in golden["entries"]:
        e = vector["entry"]
        sealed = seal(
            key,
            log=e["log"],
            session=e["session"],
            seq=e["seq"],
            index=e["index"],
            ts=e["ts"],
            kind=e["kind"],
            body=e["body"],
            prev=e["prev"],
        )
        assert sealed.raw == vector["canonical"].encode("utf-8")
        assert sealed.hash == vector["hash"] == hashlib.sha256(sealed.raw).hexdigest()
        assert pae(PAYLOAD_TYPE, sealed.raw) == base64.b64decode(vector["pae_b64"])
        assert sealed.sig == base64.b64decode(vector["sig_b64"])
        assert sealed.keyid == vector["keyid"]
        tree.append(sealed.raw)
    assert tree.size == golden["tree_size"]
    assert tree.root().hex() == golden["tree_root_hex"]


def test_the_sqlite_store_writes_the_golden_bytes(tmp_path: Path) -> None:
    from tests.ledger._fixtures import build_store
    from truss.ledger.stores.sqlite import open_sqlite

    golden = _golden()
    key = IdentityKey.from_seed(bytes.fromhex(golden["key"]["seed_hex"]), golden["key"]["name"])
    store = build_store(key, lambda k, clock: open_sqlite(tmp_path / "golden.db", key=k, clock=clock))
    written = list(store.read_range(0, store.tree_size()))
    assert [e.raw.decode() for e in written] == [v["canonical"] for v in golden["entries"]]
    assert [base64.b64encode(e.sig).decode() for e in written] == [v["sig_b64"] for v in golden["entries"]]
    assert store.tree_root().hex() == golden["tree_root_hex"]
    store.close()


def test_golden_entries_verify_and_chain() -> None:
    golden = _golden()
    trusted = TrustedKeys.from_texts([golden["key"]["vkey"]])
    entries = [
        StoredEntry.from_json({"entry": v["entry"], "hash": v["hash"], "sig": v["sig_b64"], "keyid": v["keyid"]})
        for v in golden["entries"]
    ]
    report = verify_entries(entries, trusted, full_log=True, origin=golden["key"]["name"])
    assert report.ok and report.entries == len(entries) and report.sessions == 2


def test_pae_matches_the_dsse_specification_example() -> None:
    # DSSE v1 protocol document: PAE("http://example.com/HelloWorld", "hello world")
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_the_fast_entry_encoder_always_equals_rfc8785(value: Any) -> None:
    try:
        expected = _reference(value)
    except CanonicalError:
        with pytest.raises(CanonicalError):
            entry_bytes(value)
        return
    assert entry_bytes(value) == expected


@given(
    body=st.dictionaries(st.text(max_size=6), st.integers(-(2**53 - 1), 2**53 - 1) | st.text(max_size=8), max_size=4),
    session=st.text(min_size=1, max_size=12),
    kind=st.sampled_from(sorted(KINDS)),
    seq=st.integers(0, 2**40),
    ts=st.integers(0, 2**50),
)
def test_sealing_with_pre_encoded_body_bytes_gives_the_same_entry(
    body: dict[str, Any], session: str, kind: str, seq: int, ts: int
) -> None:
    key = IdentityKey.from_seed(bytes(32), "seal.truss.test")
    fields: dict[str, Any] = {
        "log": key.name,
        "session": session,
        "seq": seq,
        "index": seq + 7,
        "ts": ts,
        "kind": kind,
        "prev": "ab" * 32,
    }
    try:
        body_bytes = entry_bytes(body)
    except CanonicalError:
        return
    plain = seal(key, body=body, **fields)
    spliced = seal(key, body=body, body_bytes=body_bytes, **fields)
    assert spliced.raw == plain.raw == canonical(plain.entry)
    assert spliced.sig == plain.sig


def test_keys_outside_the_bmp_sort_by_utf16_code_units() -> None:
    value = {"\U0001f600": 1, "\ufb01": 2}
    assert entry_bytes(value) == canonical(value) == '{"\U0001f600":1,"\ufb01":2}'.encode()


def test_a_record_with_unknown_kind_is_refused() -> None:
    with pytest.raises(StoreError) as info:
        check_record(Record("tool_called", {}))
    assert info.value.reason == "unknown_kind"
    assert {"session_started", "panel_review", "sandbox_egress", "key_admitted", "quota_reserved"} <= KINDS
    assert len(KINDS) == 23


def test_a_blob_that_does_not_hash_to_its_ref_is_refused() -> None:
    ref = sha256_ref(b"right")
    with pytest.raises(StoreError) as info:
        check_record(Record("mcp_tool_call", {"result": ref}, {ref: b"wrong"}))
    assert info.value.reason == "blob_mismatch"


def test_a_blob_the_body_does_not_name_is_refused() -> None:
    ref = sha256_ref(b"bytes")
    with pytest.raises(StoreError) as info:
        check_record(Record("mcp_tool_call", {}, {ref: b"bytes"}))
    assert info.value.reason == "unreferenced_blob"


_REFS = [sha256_ref(bytes([i])) for i in range(3)]
ref_bodies = st.recursive(
    st.sampled_from(_REFS) | st.text(max_size=4) | st.integers(0, 9) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@given(body=st.dictionaries(st.text(max_size=3), ref_bodies, max_size=4))
def test_a_blob_is_kept_exactly_when_its_ref_is_named_anywhere_in_the_body(body: dict[str, Any]) -> None:
    named = set(iter_refs(body))
    for i, ref in enumerate(_REFS):
        record = Record("mcp_tool_call", body, {ref: bytes([i])})
        if ref in named:
            check_record(record)
        else:
            with pytest.raises(StoreError) as info:
                check_record(record)
            assert info.value.reason == "unreferenced_blob"


class _Text(str):
    pass


@given(body=ref_bodies)
def test_refs_in_names_what_iter_refs_yields_once_each_in_order(body: Any) -> None:
    expected = list(dict.fromkeys(iter_refs(body)))
    assert refs_in(body) == expected
    nested = {"a": [_Text(_REFS[2]), {"b": body}], "c": (_REFS[1],)}  # a str subclass counts, a tuple does not
    assert refs_in(nested) == list(dict.fromkeys(iter_refs(nested)))


def test_a_body_with_nan_is_refused() -> None:
    with pytest.raises(StoreError) as info:
        check_record(Record("model_turn", {"x": float("nan")}))
    assert info.value.reason == "bad_body"


@pytest.mark.parametrize(
    "bad",
    [[], {"entry": {}, "hash": "x", "keyid": "k"}, {"entry": {}, "hash": "x", "keyid": "k", "sig": "!!"}, {"entry": 1}],
)
def test_a_malformed_portable_entry_is_a_bundle_format_error(bad: Any) -> None:
    with pytest.raises(BundleFormatError):
        StoredEntry.from_json(bad)


def test_portable_form_round_trips() -> None:
    golden = _golden()
    v = golden["entries"][3]
    item = StoredEntry.from_json({"entry": v["entry"], "hash": v["hash"], "sig": v["sig_b64"], "keyid": v["keyid"]})
    assert StoredEntry.from_json(item.to_json()) == item
    assert item.raw == v["canonical"].encode()
    assert item.refs() == [v["entry"]["body"]["args"]]
