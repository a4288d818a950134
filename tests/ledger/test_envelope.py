"""DSSE envelopes and verdict statements: the PAE known answer, the signature rules, moved verdicts."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from truss._errors import BundleFormatError, VerificationError
from truss.ledger.entry import PAYLOAD_TYPE, pae
from truss.ledger.envelope import (
    IN_TOTO_PAYLOAD_TYPE,
    Envelope,
    open_verdict,
    parse_envelope,
    sign_envelope,
    sign_verdict,
    verdict_statement,
    verify_envelope,
)
from truss.ledger.keys import IdentityKey, TrustedKeys

VECTORS = Path(__file__).parent / "vectors" / "envelope"
HEAD = "ab" * 32
OTHER_HEAD = "cd" * 32


def _key(label: str = "envelope test key", name: str = "truss.test/log") -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(label.encode()).digest(), name)


def _trusted(*keys: IdentityKey) -> TrustedKeys:
    return TrustedKeys(k.verifier for k in keys)


def _statement(session: str = "s_one", head: str = HEAD) -> dict[str, Any]:
    return verdict_statement(
        session=session,
        head=head,
        status="pass",
        checks=[{"kind": "tool_succeeded", "ok": True}],
        contract_hash="sha256:" + "0" * 64,
        checkpoint="truss.test/log\n3\nAAAA\n\n",
    )


def test_pae_matches_the_dsse_example() -> None:
    case = json.loads((VECTORS / "dsse_pae_example.json").read_text())
    assert pae(case["payloadType"], case["payload"].encode()) == case["pae"].encode()


def test_an_envelope_round_trips_and_verifies() -> None:
    key = _key()
    env = sign_envelope(b'{"x":1}', "application/example", [key])
    parsed = parse_envelope(env.to_bytes())
    assert parsed == env
    assert verify_envelope(env.to_bytes(), _trusted(key)) == b'{"x":1}'


def test_a_changed_payload_is_rejected() -> None:
    key = _key()
    doc = sign_envelope(b'{"status":"fail"}', "application/example", [key]).to_json()
    doc["payload"] = base64.b64encode(b'{"status":"pass"}').decode()
    with pytest.raises(VerificationError) as err:
        verify_envelope(doc, _trusted(key))
    assert err.value.reason == "bad_signature"


def test_a_changed_payload_type_is_rejected() -> None:
    key = _key()
    doc = sign_envelope(b"{}", "application/example", [key]).to_json()
    doc["payloadType"] = "application/other"
    with pytest.raises(VerificationError) as err:
        verify_envelope(doc, _trusted(key))
    assert err.value.reason == "bad_signature"
    with pytest.raises(VerificationError) as err:
        verify_envelope(doc, _trusted(key), payload_type="application/example")
    assert err.value.reason == "payload_type_mismatch"


def test_an_envelope_signed_by_an_unknown_key_is_rejected() -> None:
    env = sign_envelope(b"{}", "application/example", [_key("stranger")])
    with pytest.raises(VerificationError) as err:
        verify_envelope(env, _trusted(_key()))
    assert err.value.reason == "no_trusted_signature"


def test_signatures_by_unknown_keys_are_ignored_beside_a_trusted_one() -> None:
    key = _key()
    env = sign_envelope(b"{}", "application/example", [_key("stranger", "truss.test/other"), key])
    assert verify_envelope(env, _trusted(key)) == b"{}"


def test_a_ledger_entry_signature_cannot_pass_as_an_envelope_signature() -> None:
    key = _key()
    payload = b'{"kind":"verdict"}'
    entry_sig = key.sign(pae(PAYLOAD_TYPE, payload))
    forged = Envelope(IN_TOTO_PAYLOAD_TYPE, payload, ((key.key_id, entry_sig),))
    with pytest.raises(VerificationError) as err:
        verify_envelope(forged, _trusted(key))
    assert err.value.reason == "bad_signature"


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"payloadType":"t","payload":"e30=","signatures":[]}',
        b'{"payloadType":"t","payload":"***","signatures":[{"keyid":"k","sig":"AA=="}]}',
        b'{"payloadType":"","payload":"e30=","signatures":[{"keyid":"k","sig":"AA=="}]}',
        b'{"payloadType":"t","payload":"e30=","signatures":[{"keyid":1,"sig":"AA=="}]}',
        b"[" * 100000,
    ],
    ids=[
        "not_json",
        "not_object",
        "no_signatures",
        "bad_base64",
        "empty_type",
        "keyid_not_string",
        "deep",
    ],
)
def test_malformed_envelopes_are_refused_as_bad_input(data: bytes) -> None:
    with pytest.raises(BundleFormatError):
        verify_envelope(data, _trusted(_key()))


def test_a_verdict_opens_with_its_session_head_and_predicate() -> None:
    key = _key()
    env = sign_verdict(_statement(), key)
    verdict = open_verdict(env.to_bytes(), _trusted(key), session="s_one", head=HEAD)
    assert (verdict.session, verdict.head, verdict.status) == ("s_one", HEAD, "pass")
    assert verdict.statement["subject"] == [{"name": "truss-session:s_one", "digest": {"sha256": HEAD}}]
    assert verdict.statement["predicateType"] == "https://truss.dev/verdict/v1"
    assert verdict.checkpoint == "truss.test/log\n3\nAAAA\n\n"


def test_a_verdict_pointing_at_another_sessions_head_is_rejected() -> None:
    key = _key()
    env = sign_verdict(_statement(head=OTHER_HEAD), key)
    with pytest.raises(VerificationError) as err:
        open_verdict(env, _trusted(key), session="s_one", head=HEAD)
    assert err.value.reason == "verdict_head_mismatch"


def test_a_verdict_of_another_session_is_rejected() -> None:
    key = _key()
    env = sign_verdict(_statement(session="s_two"), key)
    with pytest.raises(VerificationError) as err:
        open_verdict(env, _trusted(key), session="s_one")
    assert err.value.reason == "verdict_session_mismatch"


def test_a_statement_whose_subject_and_head_disagree_is_rejected() -> None:
    key = _key()
    statement = _statement()
    statement["predicate"]["head"] = OTHER_HEAD
    with pytest.raises(VerificationError) as err:
        open_verdict(sign_verdict(statement, key), _trusted(key))
    assert err.value.reason == "verdict_head_mismatch"


def test_an_envelope_of_another_statement_type_is_not_a_verdict() -> None:
    key = _key()
    statement = _statement()
    statement["predicateType"] = "https://slsa.dev/provenance/v1"
    with pytest.raises(VerificationError) as err:
        open_verdict(sign_verdict(statement, key), _trusted(key))
    assert err.value.reason == "bad_statement"


def test_an_envelope_in_url_safe_base64_without_padding_verifies() -> None:
    key = _key()
    payload = b"\xfb\xff\xfe" * 7
    doc = sign_envelope(payload, "application/example", [key]).to_json()
    doc["payload"] = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    doc["signatures"][0]["sig"] = doc["signatures"][0]["sig"].replace("+", "-").replace("/", "_").rstrip("=")
    assert verify_envelope(doc, _trusted(key)) == payload


def test_unrecognized_envelope_and_signature_fields_are_ignored_as_dsse_requires() -> None:
    key = _key()
    doc = sign_envelope(b'{"x":1}', "application/example", [key]).to_json()
    doc["comment"] = {"from": "another producer"}
    doc["signatures"][0]["cert"] = "-----BEGIN CERTIFICATE-----"
    assert verify_envelope(json.dumps(doc).encode(), _trusted(key)) == b'{"x":1}'
    assert parse_envelope(doc).to_json() == sign_envelope(b'{"x":1}', "application/example", [key]).to_json()
