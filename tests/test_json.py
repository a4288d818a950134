"""``truss._json.loads`` is ``json.loads`` for bytes: the same value or the same error, for any bytes."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truss._json import loads

documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32"]


def _outcome(data: bytes) -> tuple[str, Any]:
    try:
        return "value", json.loads(data)
    except ValueError as exc:
        return "error", type(exc)


def _ours(data: bytes) -> tuple[str, Any]:
    try:
        return "value", loads(data)
    except ValueError as exc:
        return "error", type(exc)


@settings(max_examples=300, deadline=None)
@given(documents, st.sampled_from(ENCODINGS), st.booleans())
def test_loads_reads_every_encoding_json_loads_reads_as_it_does(value: Any, encoding: str, spaced: bool) -> None:
    text = json.dumps(value, ensure_ascii=False, indent=1 if spaced else None)
    data = text.encode(encoding, "surrogatepass")
    assert _ours(data) == _outcome(data)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=40)
    | st.binary(max_size=20).map(lambda b: b"{" + b)
    | st.binary(max_size=20).map(lambda b: b"[" + b)
)
def test_loads_fails_where_json_loads_fails_and_reads_what_it_reads(data: bytes) -> None:
    assert _ours(data) == _outcome(data)


@pytest.mark.parametrize("data", [b'{"a": "\xed\xa0\x80"}', codecs.BOM_UTF8 + b"{}", b"{\x00}\x00", b"[1] x", b"{"])
def test_loads_agrees_on_surrogates_byte_order_marks_wide_encodings_and_bad_endings(data: bytes) -> None:
    assert _ours(data) == _outcome(data)
