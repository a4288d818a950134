"""RFC 8785 (JSON Canonicalization Scheme) bytes: the one encoder for everything hashed or signed.

``canonical(value)`` takes JSON-shaped Python values (dict with str keys, list, str, int, float,
bool, None) and returns UTF-8 bytes:

- object members sorted by the UTF-16 code units of their names, no whitespace;
- strings escaped as ECMAScript ``JSON.stringify`` does (``\\"``, ``\\\\``, ``\\b\\f\\n\\r\\t``,
  other controls as ``\\u00xx``), everything else literal UTF-8; lone surrogates are refused;
- numbers formatted as ECMAScript ``Number.prototype.toString`` formats a double; NaN and the
  infinities are refused, and so is every number written as plain digits whose magnitude is 2**53 or
  more: an integer outside I-JSON's +/-(2**53 - 1) (RFC 7493 section 2.2), and a double from 2**53 up
  to 10**21, which ECMAScript prints as digits (``1e20`` as ``100000000000000000000``) and every
  JSON reader then reads back as such an integer. So every canonical text re-encodes to itself
  after ``json.loads``, in this encoder and in any other RFC 8785 implementation that keeps to
  I-JSON (the ``rfc8785`` package refuses those integers). A double of 10**21 or more prints with
  an exponent (``1e+21``), reads back as a double, and is kept.

It does no I/O. ``CanonicalError`` (a ``ValueError``) names the JSON pointer of the bad value.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, cast

__all__ = [
    "INT_LIMIT",
    "MAX_DEPTH",
    "CanonicalError",
    "canonical",
    "is_plain",
    "number_problem",
    "plain_canonical",
    "sha256_ref",
    "value_ref",
]

INT_LIMIT = 2**53
"""Integers (and digits-only numbers) must lie strictly within +/-INT_LIMIT: I-JSON's +/-(2**53 - 1)."""
_INT_LIMIT = INT_LIMIT
_EXPONENT_FROM = 1e21  # ECMAScript prints a double of this magnitude or more with an exponent
# ``type`` itself, typed for values of unknown type: the fast path compares exact types.
_type_of: Callable[[object], type[object]] = type
_MAX_DEPTH = 128
MAX_DEPTH = _MAX_DEPTH
"""The deepest nesting ``canonical`` encodes (the root is depth 0; a value at depth 129 is refused)."""

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class CanonicalError(ValueError):
    """A value that has no RFC 8785 form; ``pointer`` is where it is."""

    def __init__(self, message: str, pointer: str) -> None:
        super().__init__(f"{message} at {pointer or '/'}")
        self.pointer = pointer


_FAST = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _c_encoder() -> Callable[[Any, int], Sequence[str]] | None:
    """``_FAST``'s C encoder, built once (``_FAST.encode`` builds a new one, and a circular-reference
    table, on every call): the arguments ``JSONEncoder.iterencode`` passes, without the table. A
    value ``is_plain`` accepts needs none: its depth is bounded, so it holds no cycle, and it holds
    no float or foreign type, so ``default`` is never called. None where Python has no C
    accelerator or builds it otherwise (then ``_FAST.encode``)."""
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        return make(None, _FAST.default, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    except TypeError:
        return None


_C_ENCODE = _c_encoder()


def canonical(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value``.

    Values without floats, with integers in the I-JSON range and with object keys in the Basic
    Multilingual Plane (``is_plain``) have the same RFC 8785 form as ``json.dumps`` with sorted
    keys and no whitespace: the escapes are the same, and sorting by code point equals sorting by
    UTF-16 code unit below U+10000. Those take the C encoder; everything else the reference
    encoder below. A property test holds the two paths together.
    """
    fast = plain_canonical(value)
    return fast if fast is not None else _reference(value)


def plain_canonical(value: Any) -> bytes | None:
    """``canonical(value)`` when ``value`` takes the fast path (``is_plain``: exact JSON types, no
    float, integers in range, keys in the BMP, and no lone surrogate); None otherwise. What is plain
    decodes back (``json.loads``) to a value equal to it in every type."""
    if is_plain(value):
        try:
            if _C_ENCODE is not None:
                return "".join(_C_ENCODE(value, 0)).encode("utf-8")
            return _FAST.encode(value).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: the reference encoder names where it is
    return None


def is_plain(value: Any, depth: int = 0) -> bool:
    """True when ``canonical`` may take the fast path for ``value`` (see there)."""
    # Exact types only (a str or int subclass takes the reference path); scalars inline, since this
    # runs for every entry written and verified and every model turn recorded.
    kind = _type_of(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_INT_LIMIT < value < _INT_LIMIT
    if depth > _MAX_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                return False
            item_kind = _type_of(item)
            if item_kind is str or item_kind is bool or item is None:
                continue
            if item_kind is int:
                if not -_INT_LIMIT < item < _INT_LIMIT:
                    return False
            elif not is_plain(item, depth + 1):
                return False
        return True
    if kind is list:
        for item in value:  # as for an object's values: scalars inline, no generator per array
            item_kind = _type_of(item)
            if item_kind is str or item_kind is bool or item is None:
                continue
            if item_kind is int:
                if not -_INT_LIMIT < item < _INT_LIMIT:
                    return False
            elif not is_plain(item, depth + 1):
                return False
        return True
    return False


def _reference(value: Any) -> bytes:
    """The reference encoder: RFC 8785 written out rule by rule."""
    parts: list[str] = []
    _encode(value, parts, "", 0)
    text = "".join(parts)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # only lone surrogates get here
        raise CanonicalError("lone surrogate in a string", "") from exc


def number_problem(value: object) -> str | None:
    """Why the number ``value`` has no canonical form (for messages at the edges), or None.

    None too for what is not a number (``bool`` included): only ``canonical`` decides about those.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN and the infinities are not JSON numbers"
    if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
        return "an integer of magnitude 2**53 or more is outside I-JSON's range (+/-(2**53 - 1))"
    if isinstance(value, float) and _INT_LIMIT <= abs(value) < _EXPONENT_FROM:
        return "a number of magnitude 2**53 or more written as an integer is outside I-JSON's range (+/-(2**53 - 1))"
    return None


def sha256_ref(data: bytes) -> str:
    """``sha256:<hex>``, the form every hash takes in entries and blobs."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def value_ref(value: Any) -> str:
    """``sha256_ref(canonical(value))``."""
    return sha256_ref(canonical(value))


def _encode(value: Any, out: list[str], pointer: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise CanonicalError(f"nesting deeper than {_MAX_DEPTH}", pointer)
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value, pointer))
    elif isinstance(value, int):
        if not -_INT_LIMIT < value < _INT_LIMIT:
            raise CanonicalError("integer of magnitude 2**53 or more is outside I-JSON's range", pointer)
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_number(value, pointer))
    elif isinstance(value, dict):
        items: list[tuple[str, Any]] = []
        for key, item in cast("dict[Any, Any]", value).items():
            if not isinstance(key, str):
                raise CanonicalError(f"object key {key!r} is not a string", pointer)
            items.append((key, item))
        items.sort(key=lambda kv: kv[0].encode("utf-16-be", "surrogatepass"))
        out.append("{")
        for i, (key, item) in enumerate(items):
            if i:
                out.append(",")
            child = pointer + "/" + key.replace("~", "~0").replace("/", "~1")
            out.append(_string(key, child))
            out.append(":")
            _encode(item, out, child, depth + 1)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(cast("Sequence[Any]", value)):
            if i:
                out.append(",")
            _encode(item, out, f"{pointer}/{i}", depth + 1)
        out.append("]")
    else:
        raise CanonicalError(f"{type(value).__name__} is not a JSON value", pointer)


def _string(text: str, pointer: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise CanonicalError("lone surrogate in a string", pointer)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _number(value: float, pointer: str) -> str:
    if math.isnan(value) or math.isinf(value):
        raise CanonicalError("NaN and Infinity are not JSON numbers", pointer)
    if value == 0:
        return "0"
    if _INT_LIMIT <= abs(value) < _EXPONENT_FROM:
        # Printed as digits, it would read back as an integer outside I-JSON's range.
        raise CanonicalError("number of magnitude 2**53 or more prints as an integer outside I-JSON's range", pointer)
    if value < 0:
        return "-" + _number(-value, pointer)
    # repr() gives the shortest digits that round-trip; re-lay them out as ECMAScript does.
    sign, digit_tuple, exponent = Decimal(repr(value)).as_tuple()
    assert sign == 0 and isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    stripped = len("".join(map(str, digit_tuple))) - len(digits)
    k = len(digits)
    n = exponent + stripped + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
