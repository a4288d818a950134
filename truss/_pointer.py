"""JSON Pointer (RFC 6901), strictly: the one resolver for plans, done checks and async results.

A pointer is ``""`` (the whole document) or a sequence of ``/``-prefixed reference tokens, where
``~1`` stands for ``/`` and ``~0`` for ``~``; any other ``~`` makes the pointer invalid. An array
index is ``0`` or ASCII digits without a leading zero (RFC 6901 section 4, ABNF ``array-index``):
no sign, no leading zeros, no ``-`` (which names the element after the last, so there is nothing
there) and no other Unicode digits (``"١"`` is a digit to ``str.isdigit`` but not to the RFC).

``resolve_pointer`` never raises on its inputs: an invalid pointer, a token that is not a key or
an index of the value it meets, or a scalar in the way all mean "nothing there". ``pointer_problem``
says why a pointer is invalid, for the contract loader to refuse it with its key path. Pure.
"""

from __future__ import annotations

import re
from typing import Any, cast

__all__ = ["pointer_problem", "resolve_pointer"]

_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE = re.compile(r"~(?![01])")


def pointer_problem(pointer: str) -> str | None:
    """Why ``pointer`` is not an RFC 6901 JSON pointer, or None when it is one."""
    if pointer and not pointer.startswith("/"):
        return f"JSON pointer {pointer!r} must be empty or start with '/'"
    if _BAD_ESCAPE.search(pointer):
        return f"JSON pointer {pointer!r} has a '~' that is not '~0' (for '~') or '~1' (for '/')"
    return None


def resolve_pointer(document: Any, pointer: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``pointer`` finds a value in ``document``, else ``(False, None)``."""
    if pointer == "":
        return True, document
    if pointer_problem(pointer) is not None:
        return False, None
    current: Any = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            mapping = cast(dict[str, Any], current)
            if token not in mapping:
                return False, None
            current = mapping[token]
        elif isinstance(current, list):
            items = cast(list[Any], current)
            # No list has 10**18 items; the bound also keeps int() off a thousands-of-digits token.
            if len(token) > 18 or not _ARRAY_INDEX.fullmatch(token) or int(token) >= len(items):
                return False, None
            current = items[int(token)]
        else:
            return False, None
    return True, current
