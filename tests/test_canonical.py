"""RFC 8785 canonical JSON: the RFC's own examples as data files, a round trip, and the refusals."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truss.ledger.canonical import CanonicalError, canonical, sha256_ref, value_ref

VECTORS = Path(__file__).parent / "vectors" / "rfc8785"


def _number_table() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for line in (VECTORS / "numbers.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            ieee, expected = line.split()
            rows.append((ieee, expected))
    return rows


@pytest.mark.parametrize(("ieee", "expected"), _number_table())
def test_numbers_format_as_in_rfc8785_appendix_b(ieee: str, expected: str) -> None:
    value: float = struct.unpack(">d", bytes.fromhex(ieee))[0]
    if expected == "error":
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


SAFE_INT = 2**53
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
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
    # JSON numbers are doubles (I-JSON): an integral double above 2**53 prints as plain digits,
    # which Python would read back as an exact int of a different value, so read it as a double.
    return json.loads(encoded, parse_int=lambda s: int(s) if abs(int(s)) <= SAFE_INT else float(s))


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_bytes_parse_back_to_the_same_value(value: Any) -> None:
    encoded = canonical(value)
    assert _parse(encoded) == value
    assert canonical(_parse(encoded)) == encoded  # a fixed point: canonical of canonical is itself


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_double_survives_the_round_trip_exactly(value: float) -> None:
    back = _parse(canonical(value))
    assert (back == value and math.copysign(1, back) == math.copysign(1, value)) or value == 0


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
        2**53 + 1,
        -(2**53) - 1,
        2**60,
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
        "int_beyond_2_53",
        "int_below_minus_2_53",
        "int_that_is_a_double_printing_other_digits",
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
def test_an_integer_beyond_2_53_that_is_a_double_printing_as_its_digits_keeps_them(value: int) -> None:
    # An integral double such as 1e20 prints as plain digits; json.loads reads those back as an int.
    # Refusing that int would make every record holding such a double unverifiable once re-read.
    encoded = canonical(value)
    assert encoded == str(value).encode() == canonical(float(value))
    assert canonical(json.loads(encoded)) == encoded


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


def test_integers_at_the_safe_limit_are_exact() -> None:
    assert canonical([2**53, -(2**53)]) == b"[9007199254740992,-9007199254740992]"
