"""Regenerate the bundles in this directory: inputs where a JavaScript verifier and Python's could part.

Run from the repository root: ``python tests/report/tampered/regenerate.py``. Each is cut from
``tests/ledger/tampered_bundles/original.json`` (trusted key: ``tests.ledger.test_bundle.log_key``)
and named after what it does. They probe the places where JSON in a browser differs from JSON in
Python: numbers (1 against 1.0, integers of 2**53 or more, doubles printing as such integers),
strings (lone surrogates, escapes), duplicate members, and the base64 spellings each side accepts.
The page and `truss ledger verify --bundle` must reach the same result on each
(``test_agreement.py``); the files, not this script, are the test data.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ORIGINAL = HERE.parents[1] / "ledger" / "tampered_bundles" / "original.json"


def _canonical_entry_hash(entry: dict[str, Any]) -> str:
    import sys

    sys.path.insert(0, str(HERE.parents[2]))
    from truss.ledger.canonical import canonical

    return hashlib.sha256(canonical(entry)).hexdigest()


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def main() -> None:
    original: dict[str, Any] = json.loads(ORIGINAL.read_bytes())
    files: dict[str, str] = {}

    # 2.0 has the canonical form "2" (so the hash stays right), but it is not an integer: V1 refuses it.
    text = _text(original)
    seq2 = '"seq":2,"session":"s_verdict"'
    assert text.count(seq2) == 1
    files["seq_written_as_a_float"] = text.replace(seq2, '"seq":2.0,"session":"s_verdict"')

    # An integer past 2**53 has no exact double, so it has no RFC 8785 form: unusable, not re-rounded.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["n"] = 2**53 + 1
    files["integer_beyond_2_53_in_a_body"] = _text(doc)

    # Exactly 2**53: a double holds it, but it is outside I-JSON's +/-(2**53 - 1), so it has no canonical form.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["n"] = 2**53
    files["integer_at_2_53_in_a_body"] = _text(doc)

    # 1e20 is a float to both readers, but RFC 8785 prints it as 100000000000000000000: refused too.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["n"] = 1e20
    files["double_printing_as_digits_beyond_2_53_in_a_body"] = _text(doc)

    # Integer digits past 1e21: JavaScript reads a double that prints as 1e+24, Python an integer.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["n"] = 10**24
    files["integer_digits_past_1e21_in_a_body"] = _text(doc)

    # 1e21 prints with an exponent and reads back as a double: canonical, so only the signature fails.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["n"] = 1e21
    files["double_at_1e21_in_a_body"] = _text(doc)

    # A lone surrogate is a JSON string but not Unicode text: no canonical bytes.
    doc = copy.deepcopy(original)
    doc["entries"][3]["entry"]["body"]["note"] = "\ud800"
    files["lone_surrogate_in_a_body"] = json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=True)

    # The same member twice: both readers keep the last one, which is the signed one.
    text = _text(original)
    kind = '"kind":"mcp_tool_call"'
    first = text.index(kind)
    files["member_repeated_with_the_signed_value_last"] = text[:first] + '"kind":"mcp_tool_denied",' + text[first:]

    # The same member twice, the forged value last: the signature no longer matches.
    files["member_repeated_with_a_forged_value_last"] = (
        text[: first + len(kind)] + ',"kind":"mcp_tool_denied"' + text[first + len(kind) :]
    )

    # Escapes that spell the same string: the canonical bytes are rebuilt, so the entry still verifies.
    text = _text(original)
    files["strings_written_with_unicode_escapes"] = text.replace('"mcp:time:get_time"', '"mcp:time:get\\u005ftime"')

    # A signature in URL-safe base64: Python's decoder (validate=True) refuses the alphabet.
    doc = copy.deepcopy(original)
    sig = doc["entries"][1]["sig"]
    doc["entries"][1]["sig"] = sig.replace("+", "-").replace("/", "_") if ("+" in sig or "/" in sig) else "-" + sig[1:]
    files["signature_in_url_safe_base64"] = _text(doc)

    # Non-zero bits after the last base64 digit: both decoders drop them, so the same signature verifies.
    doc = copy.deepcopy(original)
    sig = doc["entries"][1]["sig"]
    assert sig.endswith("==")
    last = sig[-3]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    doc["entries"][1]["sig"] = sig[:-3] + alphabet[alphabet.index(last) ^ 1] + "=="
    assert base64.b64decode(doc["entries"][1]["sig"]) == base64.b64decode(sig)
    files["signature_with_stray_padding_bits"] = _text(doc)

    # A payload with stray padding bits: bundles promise canonical base64, so it is unusable.
    doc = copy.deepcopy(original)
    ref = sorted(doc["blobs"])[0]
    data = doc["blobs"][ref]
    pad = data.index("=") if "=" in data else len(data)
    if pad < len(data):
        doc["blobs"][ref] = data[: pad - 1] + alphabet[alphabet.index(data[pad - 1]) ^ 1] + data[pad:]
    else:
        doc["blobs"][ref] = data + "="
    files["payload_in_non_canonical_base64"] = _text(doc)

    # The verdict envelope in URL-safe base64 without padding: DSSE allows it; it still verifies.
    doc = copy.deepcopy(original)
    env = doc["envelope"]
    env["payload"] = env["payload"].replace("+", "-").replace("/", "_").rstrip("=")
    env["signatures"][0]["sig"] = env["signatures"][0]["sig"].replace("+", "-").replace("/", "_").rstrip("=")
    files["envelope_in_unpadded_url_safe_base64"] = _text(doc)

    # Fields DSSE does not define, in the envelope and in its signature: consumers MUST ignore them.
    doc = copy.deepcopy(original)
    doc["envelope"]["comment"] = "added by another DSSE producer"
    doc["envelope"]["signatures"][0]["cert"] = None
    files["envelope_with_unrecognized_fields"] = _text(doc)

    # "version": true equals 1 in Python; the page reads it the same way.
    doc = copy.deepcopy(original)
    doc["version"] = True
    files["version_written_as_true"] = _text(doc)

    # A kind this version of Truss does not know, hash restated: malformed, at that entry.
    doc = copy.deepcopy(original)
    doc["entries"][2]["entry"]["kind"] = "sandbox_egress"
    doc["entries"][2]["hash"] = _canonical_entry_hash(doc["entries"][2]["entry"])
    files["kind_unknown_to_this_version"] = _text(doc)

    # An extra member in an entry, hash restated: V1 refuses it.
    doc = copy.deepcopy(original)
    doc["entries"][4]["entry"]["extra"] = 1
    doc["entries"][4]["hash"] = _canonical_entry_hash(doc["entries"][4]["entry"])
    files["entry_with_an_extra_member"] = _text(doc)

    # A UTF-8 byte-order mark before the bundle: both readers skip it.
    files["byte_order_mark_before_the_bundle"] = "\ufeff" + _text(original)

    # The bundle's own key (reported, never trusted) with a million spaces inside it: Python's strip
    # is linear, a strip written as /\s+$/ is quadratic and holds the page for hours.
    doc = copy.deepcopy(original)
    name, rest = doc["vkey"].split("+", 1)
    doc["vkey"] = name + " " * 1_000_000 + "+" + rest
    files["bundle_key_with_a_million_spaces_inside"] = _text(doc)

    # The bundle's own key behind a byte-order mark: str.strip() keeps U+FEFF (not white space to
    # Python), so the key is not the trusted one, though it is once the mark is dropped.
    doc = copy.deepcopy(original)
    doc["vkey"] = "\ufeff" + doc["vkey"]
    files["bundle_key_behind_a_byte_order_mark"] = _text(doc)

    for name, content in files.items():
        (HERE / f"{name}.json").write_text(content, encoding="utf-8")


if __name__ == "__main__":
    main()
