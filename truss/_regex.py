"""Regular expressions on text Truss does not control: a backtracking profile, and a linear-time engine.

``regex_profile(pattern)`` is used wherever Truss runs an operator's pattern on text it does not
control: policy conditions on tool arguments (``truss.policy``) and contract parameters whose
values come from callers (``truss.contract``). A pattern that nests repetition is never run on
such text; any other pattern is run only on strings up to ``RegexProfile.max_chars`` characters.

``linear_regex(pattern)`` compiles a pattern for RE2 (``google-re2``), an automaton engine whose
matching time is linear in the text whatever the pattern: the one to use when the *pattern* is
untrusted too (an MCP server's ``outputSchema``), or when a pattern must run on long text. RE2
refuses what it cannot match in linear time (look-around, back-references, possessive and atomic
forms); ``NotLinearError`` says why. Its syntax is Python's and ECMA-262's for everything else,
with two differences worth knowing: ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (as in ECMA-262,
unlike Python's Unicode classes), and the end of text is ``\\z`` (Python's ``\\Z``).

A leaf: it imports nothing of Truss's, so both the contract models and the policy can use it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LINEAR",
    "MAX_MATCH_CHARS",
    "REGEX_STEP_BUDGET",
    "LinearRegex",
    "NotLinearError",
    "RegexProfile",
    "linear_regex",
    "linear_search",
    "regex_profile",
]

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


class NotLinearError(ValueError):
    """A pattern the linear-time engine cannot run: invalid, or a feature that needs backtracking.

    ``pattern`` is the pattern, ``reason`` RE2's own words (for example ``invalid perl operator:
    (?=``, ``invalid escape sequence: \\1``, ``pattern too large - compile failed``).
    """

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"pattern {pattern[:80]!r} cannot run in linear time: {reason}")
        self.pattern = pattern
        self.reason = reason


class LinearRegex:
    """A pattern compiled for RE2: every match costs time linear in the text (module docstring).

    Matching takes ``str`` (encoded to UTF-8, lone surrogates included, so nothing raises) and
    answers only whether it matched: callers that need groups use ``re`` on trusted patterns.
    """

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str, compiled: Any) -> None:
        self.pattern = pattern
        self._compiled = compiled

    def search(self, text: str) -> bool:
        """True when the pattern matches somewhere in ``text`` (``re.search``; JSON Schema's ``pattern``)."""
        return self._compiled.search(_utf8(text)) is not None

    def fullmatch(self, text: str) -> bool:
        """True when the pattern matches the whole of ``text`` (``re.fullmatch``)."""
        return self._compiled.fullmatch(_utf8(text)) is not None

    def __repr__(self) -> str:
        return f"LinearRegex({self.pattern!r})"


def _utf8(text: str) -> bytes:
    # Bytes in, so RE2 returns byte offsets and the binding skips mapping them back to characters.
    return text.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=1024)
def linear_regex(pattern: str) -> LinearRegex:
    """``pattern`` compiled for the linear-time engine; ``NotLinearError`` when RE2 refuses it.

    Compiling is bounded too: RE2 refuses a pattern whose automaton would pass its memory budget
    (8 MiB) instead of building it. Compiled patterns are cached (the last 1024).
    """
    import re2  # a C extension (a few ms to load): only the callers that match need it

    options = re2.Options()
    options.log_errors = False  # RE2 would print its refusal on stderr; the error carries it instead
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else "refused"
        reason = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        raise NotLinearError(pattern, reason) from None
    except (TypeError, ValueError, UnicodeError) as exc:  # a lone surrogate in the pattern, say
        raise NotLinearError(pattern, type(exc).__name__) from None
    return LinearRegex(pattern, compiled)


def linear_search(pattern: str, text: str) -> bool:
    """``linear_regex(pattern).search(text)``: raises ``NotLinearError`` for a pattern RE2 refuses."""
    return linear_regex(pattern).search(text)
