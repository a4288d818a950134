"""RFC 8785 canonical JSON: the RFC's own examples as data files, a round trip, and the refusals."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, cast

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from truss.ledger.canonical import INT_LIMIT, CanonicalError, canonical, plain_canonical, sha256_ref, value_ref

VECTORS = Path(__file__).parent / "vectors" / "rfc8785"


def _number_table() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for line in (VECTORS / "numbers.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            ieee, expected = line.split()
            rows.append((ieee, expected))
    return rows


def _digits_beyond_i_json(text: str) -> bool:
    return text.lstrip("-").isdigit() and abs(int(text)) >= INT_LIMIT


@pytest.mark.parametrize(("ieee", "expected"), _number_table())
def test_numbers_format_as_in_rfc8785_appendix_b(ieee: str, expected: str) -> None:
    value: float = struct.unpack(">d", bytes.fromhex(ieee))[0]
    # The appendix prints 2**53 and 295147905179352830000 as digits; a reader takes those for
    # integers outside I-JSON's range, which Truss refuses (docs/ledger-format.md 2.1).
    if expected == "error" or _digits_beyond_i_json(expected):
        with pytest.raises(CanonicalError):
            canonical(value)
    else:
        assert canonical(value) == expected.encode()


def test_members_sort_by_utf16_code_units_as_in_the_rfc_sorting_example() -> None:
    value = json.loads((VECTORS / "sorting.input.json").read_text(encoding="utf-8"))
    assert canonical(value) == (VECTORS / "sorting.expected.json").read_bytes()


def test_the_rfc_main_example_canonicalises_byte_for_byte() -> None:
    value = json.loads((VECTORS / "example.input.json").read_text(encoding="utf-8"))
    assert canonical(value) == (VECTORS / "example.expected.json").read_bytes()


def test_sha256_ref_and_value_ref_name_the_hash_of_the_canonical_bytes() -> None:
    assert sha256_ref(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert value_ref({"b": 1, "a": [True, None]}) == sha256_ref(b'{"a":[true,null],"b":1}')


SAFE_INT = INT_LIMIT - 1
# Doubles from 2**53 up to 1e21 print as digits, so they are refused like the integers they read back as.
recordable_floats = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not INT_LIMIT <= abs(f) < 1e21)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | recordable_floats
    | st.text(st.characters(exclude_categories=["Cs"]))
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def _parse(encoded: bytes) -> Any:
    return json.loads(encoded)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_bytes_parse_back_to_the_same_value(value: Any) -> None:
    encoded = canonical(value)
    assert _parse(encoded) == value
    assert canonical(_parse(encoded)) == encoded  # a fixed point: canonical of canonical is itself


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_double_survives_the_round_trip_exactly_or_is_refused(value: float) -> None:
    if INT_LIMIT <= abs(value) < 1e21:
        with pytest.raises(CanonicalError):
            canonical(value)
        return
    back = _parse(canonical(value))
    assert (back == value and math.copysign(1, back) == math.copysign(1, value)) or value == 0


wide_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([INT_LIMIT, -INT_LIMIT, INT_LIMIT - 1, 1 - INT_LIMIT, 10**20, 1e20, 2.0**53, 1e21, 6.02e23])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]))
)
wide_values = st.recursive(
    wide_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(wide_values)
def test_an_independent_rfc8785_implementation_rebuilds_every_canonical_text(value: Any) -> None:
    # What a third-party verifier does with an entry: read its bytes as JSON and canonicalise again
    # (the rfc8785 package keeps to I-JSON's integer range). Whatever Truss writes, it must rebuild.
    try:
        encoded = canonical(value)
    except CanonicalError:
        return
    assert rfc8785.dumps(json.loads(encoded)) == encoded


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.integers(0, 9), max_size=8))
def test_member_order_does_not_change_the_bytes(value: dict[str, int]) -> None:
    try:
        encoded = canonical(value)
    except CanonicalError:
        return  # a lone surrogate in a key: refused either way
    assert canonical(dict(reversed(list(value.items())))) == encoded


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        [1, {"a": math.nan}],
        "\ud800",
        {"\udfff": 1},
        2**53,
        -(2**53),
        {"a": [1, 2**53]},
        2**53 + 1,
        -(2**53) - 1,
        2**60,
        10**20,
        1e20,
        -(2.0**53),
        10**21,
        10**400,
        {1: "non-string key"},
        b"bytes",
        {1.5},
    ],
    ids=[
        "nan",
        "inf",
        "minus_inf",
        "nested_nan",
        "lone_high_surrogate",
        "lone_low_surrogate_key",
        "int_at_2_53",
        "int_at_minus_2_53",
        "nested_int_at_2_53",
        "int_beyond_2_53",
        "int_below_minus_2_53",
        "int_that_is_a_double_printing_other_digits",
        "int_that_is_a_double_printing_its_digits",
        "double_printing_as_digits_beyond_2_53",
        "double_at_minus_2_53",
        "int_a_double_prints_with_an_exponent",
        "int_beyond_every_double",
        "non_string_key",
        "bytes",
        "set",
    ],
)
def test_values_without_a_json_form_are_refused(value: Any) -> None:
    with pytest.raises(CanonicalError):
        canonical(value)


@pytest.mark.parametrize("value", [10**20, -(10**20), 123 * 10**18, 2**54])
def test_an_integral_double_printing_as_digits_beyond_2_53_is_refused_like_the_integer(value: int) -> None:
    # 1e20 prints as 100000000000000000000, which json.loads reads back as an int: keeping the double
    # while refusing the int would make the record unverifiable once re-read.
    for form in (value, float(value)):
        with pytest.raises(CanonicalError):
            canonical(form)


@pytest.mark.parametrize(
    ("value", "text"),
    [(1e21, b"1e+21"), (-6.02e23, b"-6.02e+23"), (1.7976931348623157e308, b"1.7976931348623157e+308")],
)
def test_a_double_printed_with_an_exponent_is_kept_whatever_its_size(value: float, text: bytes) -> None:
    assert canonical(value) == text
    assert json.loads(text) == value and canonical(json.loads(text)) == text


def test_refusal_names_the_pointer_of_the_bad_value() -> None:
    with pytest.raises(CanonicalError) as caught:
        canonical({"a": [0, {"b/c": math.nan}]})
    assert caught.value.pointer == "/a/1/b~1c"


def test_nesting_beyond_the_limit_is_refused_not_a_recursion_error() -> None:
    value: Any = 0
    for _ in range(200):
        value = [value]
    with pytest.raises(CanonicalError):
        canonical(value)


def test_integers_at_the_i_json_limit_are_exact() -> None:
    assert canonical([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"
    assert canonical({"a": [2**53 - 1]}) == b'{"a":[9007199254740991]}'  # the fast path holds the same bound


bmp_keys = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=["Cs"]), max_size=6)
plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(bmp_keys, children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(plain_values)
def test_values_without_floats_take_the_fast_encoder_and_get_the_reference_bytes(value: Any) -> None:
    from truss.ledger.canonical import _reference, is_plain  # pyright: ignore[reportPrivateUsage]

    assert is_plain(value)
    assert canonical(value) == _reference(value) == canonical(value)  # the encoder built once is reused


def test_a_plain_value_nested_to_the_limit_and_shared_subvalues_encode_as_the_reference_does() -> None:
    from truss.ledger.canonical import MAX_DEPTH, _reference  # pyright: ignore[reportPrivateUsage]

    deep: Any = "x"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    shared = {"a": 1}
    values: list[Any] = [deep, [shared, shared, {"s": shared}], "\u00e9\u2028\x7f\x00", {}, [], 0]
    for value in values:
        assert canonical(value) == _reference(value)


def _types(value: Any) -> Any:
    """``value`` with every scalar replaced by its type's name."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in cast(dict[str, Any], value).items()}
    if isinstance(value, list):
        return [_types(v) for v in cast(list[Any], value)]
    return type(cast(object, value)).__name__


@settings(max_examples=200, deadline=None)
@given(wide_values)
def test_plain_canonical_is_canonical_for_what_decodes_back_in_every_type_and_none_otherwise(value: Any) -> None:
    plain = plain_canonical(value)
    if plain is None:
        return
    assert plain == canonical(value)
    assert _parse(plain) == value and _types(_parse(plain)) == _types(value)  # 2.0 would come back as 2


@pytest.mark.parametrize("value", [2.0, [1, 0.5], {"a": 2**53}, (1, 2), {"\U0001f600": 1}, "\ud800", True.__class__])
def test_plain_canonical_leaves_floats_big_integers_tuples_astral_keys_and_surrogates_to_canonical(value: Any) -> None:
    assert plain_canonical(value) is None
