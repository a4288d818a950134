"""How much a regular expression can backtrack, read from its text without running it.

``regex_profile(pattern)`` is used wherever Truss runs an operator's pattern on text it does not
control: policy conditions on tool arguments (``truss.policy``) and contract parameters whose
values come from callers (``truss.contract``). A pattern that nests repetition is never run on
such text; any other pattern is run only on strings up to ``RegexProfile.max_chars`` characters.

A leaf: it imports nothing of Truss's, so both the contract models and the policy can use it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["LINEAR", "MAX_MATCH_CHARS", "REGEX_STEP_BUDGET", "RegexProfile", "regex_profile"]

MAX_MATCH_CHARS = 65_536
"""The longest string a ``glob``, ``not_glob`` or ``regex`` condition is run against."""


@dataclass(frozen=True)
class RegexProfile:
    """How much backtracking a pattern can do, read from its text (see ``regex_profile``).

    ``quantifiers`` counts unbounded quantifiers (``*``, ``+``, ``{n,}``) that can backtrack
    (not possessive), and back-references (their length is only known at run time). ``nested``
    is set when a repetition of variable length (``*``, ``+``, ``?``, ``{1,3}``) or an
    alternation sits inside a group that is itself repeated without bound and is not atomic: the
    shape of exponential backtracking (``(a+)+``, ``(a|aa)*``). ``max_chars`` is the longest input
    the pattern is run against, so that about ``max_chars ** quantifiers`` steps stay under
    ``REGEX_STEP_BUDGET``.
    """

    quantifiers: int
    nested: bool

    @property
    def max_chars(self) -> int:
        if self.quantifiers <= 1:
            return MAX_MATCH_CHARS
        return min(MAX_MATCH_CHARS, int(REGEX_STEP_BUDGET ** (1.0 / self.quantifiers)))


REGEX_STEP_BUDGET = 100_000_000
"""Backtracking steps a ``regex`` condition may cost at worst (a tenth of a second or so)."""

LINEAR = RegexProfile(0, False)
"""The profile of a pattern with no repetition that can backtrack (a glob, which fnmatch compiles linearly)."""


@dataclass
class _Group:
    atomic: bool
    variable_inside: bool = False  # a repetition of variable length: '*', '+', '?', '{1,3}'
    alternation: bool = False


_DIGITS = frozenset("123456789")
_QUANTIFIER_RE = re.compile(r"(\*|\+|\?|\{(\d*)(,?)(\d*)\})([?+]?)")


@functools.lru_cache(maxsize=256)
def regex_profile(pattern: str) -> RegexProfile:
    """Read a pattern's backtracking shape without running it.

    A conservative text scan, not a parser: it may call a safe pattern nested (for example
    ``(?:[a-z]+/)*``), never the other way round for the shapes it knows. The fix for a pattern
    it calls nested is an atomic group or a possessive quantifier, ``(?>[a-z]+/)*`` or
    ``(?:[a-z]+/)*+``, which Python supports since 3.11.
    """
    stack = [_Group(atomic=False)]
    count = 0
    nested = False
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        closed: _Group | None = None
        if ch == "\\":
            # A back-reference matches a length only known at run time: it backtracks like '.*'.
            if pattern[i + 1 : i + 2] in _DIGITS:
                count += 1
                stack[-1].variable_inside = True
            i += 2
        elif ch == "[":
            i = _skip_class(pattern, i)
        elif ch == "(":
            if pattern.startswith("(?#", i):
                end = pattern.find(")", i)
                i = n if end < 0 else end + 1
                continue
            if pattern.startswith("(?P=", i):
                count += 1
                stack[-1].variable_inside = True
            stack.append(_Group(atomic=pattern.startswith("(?>", i)))
            i += 1
            continue
        elif ch == ")":
            closed = stack.pop() if len(stack) > 1 else _Group(atomic=False)
            i += 1
        elif ch == "|":
            stack[-1].alternation = True
            i += 1
            continue
        else:
            i += 1
        match = _QUANTIFIER_RE.match(pattern, i)
        unbounded = variable = possessive = False
        if match is not None:
            symbol, lower, comma, upper, mode = match.groups()
            if symbol != "{}":  # '{}' is a literal as Python's re reads it
                unbounded = symbol in ("*", "+") or (bool(comma) and not upper)
                variable = symbol == "?" or unbounded or (bool(comma) and (lower or "0") != upper)
                possessive = mode == "+"
                i = match.end()
        if closed is not None:
            risky_inside = (closed.variable_inside or closed.alternation) and not closed.atomic
            if unbounded and not possessive and risky_inside:
                nested = True
            if closed.variable_inside and not closed.atomic:
                stack[-1].variable_inside = True
        if variable and not possessive:
            stack[-1].variable_inside = True
        if unbounded and not possessive:
            count += 1
    return RegexProfile(count, nested)


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class that starts at ``pattern[i] == '['``."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1
