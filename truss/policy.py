"""Policy: may this tool be called with these arguments? A pure decision over values.

``decide(contract, tool, arguments, mounted)`` returns ``Allow``, ``Deny`` or ``Ask``. It reads
nothing but its arguments: no I/O, no clock, no environment. The gate (``truss.gate``) calls it
for every requested call, records the outcome and acts on it; this module never records,
charges or calls anything. Budgets are ``truss.budget``'s business.

Order (the first step that decides wins):

1. **Mounted.** A tool that is not in ``mounted`` (the allowlisted tools of the connected
   servers), whose server the contract does not declare, or that the server's ``allow_tools``
   does not list, is denied ``not_mounted``. The last two checks repeat what the client tier
   already did when it mounted the tools: an allowlist is enforced here too, so a stale or
   forged mount set can never widen it.
2. **Arguments are an object.** Anything else is denied ``bad_arguments``.
3. **readonly_only.** When set, a tool whose definition does not carry ``readOnlyHint: true`` is
   denied ``readonly_only``. Annotations come from an untrusted server, so they are only ever
   used to refuse, never to grant.
4. **Rules, in order, first match wins.** A rule matches when its ``tool`` glob matches the
   namespaced name (``fnmatch.fnmatchcase``: case-sensitive, ``*`` also matches ``:`` and ``/``)
   and every argument condition holds. Conditions are evaluated in three values (holds, fails,
   unknown); an argument that is missing or of the wrong type for its condition is *unknown*.
   A rule with a failing condition does not match. A rule whose conditions are otherwise all
   unknown or holding matches if it is a ``deny`` or ``ask`` rule (the careful outcome) and does
   not match if it is an ``allow`` rule: an untestable argument never grants anything.
5. **Default.** No rule matched: ``policy.default`` (allow or deny).

Arguments are untrusted model output. ``decide`` never raises on them: any JSON value (and any
odd Python value) is handled. Patterns never run over unbounded input: a ``glob``/``not_glob``
runs on strings up to ``MAX_MATCH_CHARS`` characters, a ``regex`` on strings up to the limit its
backtracking shape allows (``regex_profile``), and a longer string tested by a pattern denies the
call (``bad_arguments``) whatever the rule's effect, unless another of the rule's conditions
fails. A regex that nests repetition (exponential on a crafted string) is never run on an
argument at all: its condition is unknown. The path operators (``glob``, ``not_glob``, ``regex``,
``under``) match the value as ``normalise_path`` rewrites it and never vouch for a value with a
``..`` path segment: unknown too. ``each`` applies its conditions to every element of an array.
Reasons name arguments and conditions, never argument values, so a secret argument can not leak
into the ledger or the model's context through a denial.

``lint(contract)`` reports valid policies that will not behave as written, for ``contract check``.
What this module does not do: interpret paths beyond ``normalise_path`` (symlinks, case folding),
validate arguments against the tool's input schema (the gate does), or count anything.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, cast

from truss._regex import LINEAR, MAX_MATCH_CHARS, REGEX_STEP_BUDGET, RegexProfile, regex_profile
from truss.contract import ArgCondition, Contract, PolicyRule
from truss.tools import MountedTool, namespaced, split_namespaced

__all__ = [
    "MAX_MATCH_CHARS",
    "REGEX_STEP_BUDGET",
    "Allow",
    "Ask",
    "Decision",
    "Deny",
    "DenyCode",
    "Finding",
    "RegexProfile",
    "decide",
    "json_equal",
    "lint",
    "regex_profile",
]

_MAX_EQUAL_DEPTH = 64

DenyCode = Literal["not_mounted", "rule", "default", "readonly_only", "missing_argument", "bad_arguments"]


@dataclass(frozen=True)
class Allow:
    """The call may proceed. ``rule`` is the index of the matching rule; None means the default."""

    rule: int | None


@dataclass(frozen=True)
class Deny:
    """The call is refused. ``code`` says which step refused it; ``rule`` is the rule index, if any.

    ``reason`` is safe to show the model and to record: it never holds argument values.
    """

    code: DenyCode
    reason: str
    rule: int | None


@dataclass(frozen=True)
class Ask:
    """A person must approve the call (``truss approve``) before it may proceed."""

    rule: int
    reason: str


Decision = Allow | Deny | Ask


def decide(
    contract: Contract,
    tool: str,
    arguments: object,
    mounted: Mapping[str, MountedTool],
) -> Decision:
    """The policy decision for calling namespaced ``tool`` with ``arguments``. Never raises on arguments.

    ``arguments`` is whatever the model sent: anything but a JSON object is denied ``bad_arguments``.
    """
    # 1. mounted, declared and allowlisted
    refusal = _not_mounted(contract, tool, mounted)
    if refusal is not None:
        return Deny("not_mounted", refusal, None)
    mounted_tool = mounted[tool]

    # 2. the arguments are an object
    given = _as_mapping(arguments)
    if given is None:
        return Deny("bad_arguments", f"the arguments of {tool} must be a JSON object", None)

    # 3. readonly_only: annotations may only restrict
    if contract.policy.readonly_only and not mounted_tool.read_only:
        return Deny(
            "readonly_only",
            f"policy.readonly_only is set and {tool} does not declare readOnlyHint: true",
            None,
        )

    # 4. rules, first match wins
    for index, rule in enumerate(contract.policy.rules):
        if not fnmatch.fnmatchcase(tool, rule.tool):
            continue
        decision = _apply_rule(index, rule, tool, given)
        if decision is not None:
            return decision

    # 5. default
    if contract.policy.default == "allow":
        return Allow(None)
    return Deny("default", f"no policy rule allows {tool} and policy.default is deny", None)


def _not_mounted(contract: Contract, tool: object, mounted: Mapping[str, MountedTool]) -> str | None:
    if not isinstance(tool, str):  # the caller's type says str; the name came from a model
        return "the tool name is not a string"
    shown = _short(tool)
    entry = mounted.get(tool)
    if entry is None:
        return f"{shown} is not a mounted tool"
    parts = split_namespaced(tool)
    if parts is None or entry.name != tool:
        return f"{shown} is not a mounted tool"
    server = contract.mcp.server(parts[0])
    if server is None:
        return f"{shown} belongs to server {parts[0]!r}, which the contract does not declare"
    if "*" not in server.allow_tools and parts[1] not in server.allow_tools:
        return f"{shown} is not in the allow_tools of server {parts[0]!r}"
    return None


def _short(tool: str) -> str:
    # Tool names can come from the model; keep an absurd one from flooding a reason.
    return tool if len(tool) <= 200 else tool[:200] + "..."


class _V(Enum):
    HOLDS = "holds"
    FAILS = "fails"
    UNKNOWN = "unknown"


_Why = Literal["", "missing", "type", "dot_dot", "relative", "unsafe_regex", "too_long"]


@dataclass(frozen=True)
class _Outcome:
    value: _V
    # For UNKNOWN: which argument, and why it could not be tested.
    argument: str = ""
    why: _Why = ""
    limit: int = 0


def _apply_rule(index: int, rule: PolicyRule, tool: str, arguments: Mapping[str, Any]) -> Decision | None:
    if not rule.args and rule.effect == "allow":  # the common rule: a tool pattern that allows (no tests to run)
        return Allow(index)
    outcomes = [_check_argument(name, condition, arguments) for name, condition in rule.args.items()]
    if any(o.value is _V.FAILS for o in outcomes):
        return None
    unknowns = [o for o in outcomes if o.value is _V.UNKNOWN]
    too_long = next((o for o in unknowns if o.why == "too_long"), None)
    if too_long is not None:
        return Deny(
            "bad_arguments",
            f"argument {too_long.argument!r} of {_short(tool)} is longer than {too_long.limit} characters, "
            f"the most policy rule {index} matches its pattern against",
            index,
        )

    if not unknowns:
        if rule.effect == "allow":
            return Allow(index)
        if rule.effect == "ask":
            return Ask(index, rule.reason or f"policy rule {index} asks a person to approve calls to {_short(tool)}")
        return Deny("rule", rule.reason or f"{_short(tool)} is denied by policy rule {index}", index)

    # A tested argument could not be tested: fail closed. An allow rule does not grant; a deny
    # rule refuses; an ask rule puts the call in front of a person.
    if rule.effect == "allow":
        return None
    first = unknowns[0]
    problem = _UNKNOWN_TEXT[first.why].format(arg=first.argument, rule=index)
    label = f" ({rule.reason})" if rule.reason else ""
    if rule.effect == "ask":
        return Ask(index, problem + label)
    codes: dict[str, DenyCode] = {"missing": "missing_argument", "unsafe_regex": "rule"}
    code = codes.get(first.why, "bad_arguments")
    return Deny(code, problem + label, index)


_UNKNOWN_TEXT = {
    "missing": "argument {arg!r} is missing and policy rule {rule} tests it",
    "type": "argument {arg!r} has a type that policy rule {rule} cannot test",
    "dot_dot": "argument {arg!r} has a '..' path segment, which policy rule {rule} never matches against a path "
    "pattern",
    "relative": "argument {arg!r} is a relative path, which policy rule {rule} cannot place under a directory",
    "unsafe_regex": "policy rule {rule} tests argument {arg!r} with a regex that nests repetition, which Truss "
    "does not run on untrusted input (make the inner repetition atomic or possessive)",
    "too_long": "argument {arg!r} is too long for policy rule {rule}",
    "": "argument {arg!r} cannot be tested by policy rule {rule}",
}


def _check_argument(name: str, condition: ArgCondition, arguments: Mapping[str, Any]) -> _Outcome:
    if name not in arguments:
        return _Outcome(_V.UNKNOWN, name, "missing")
    return _check_value(name, condition, arguments[name])


def _check_value(name: str, condition: ArgCondition, value: Any) -> _Outcome:
    """Kleene AND of the conditions on one value: any failure fails, else any unknown is unknown.

    ``each`` recurses once per level the contract nests it, never deeper than the value's own
    arrays: the contract (trusted, its TOML nested at most ``truss.contract.MAX_NESTING`` deep) bounds the depth."""
    given = condition.model_fields_set
    fails = False
    unknown: _Why | None = None
    where = name
    limit = 0

    def record(holds: bool) -> None:
        nonlocal fails
        fails = fails or not holds

    if "equals" in given:
        record(json_equal(value, condition.equals))
    if condition.in_ is not None:
        record(any(json_equal(value, option) for option in condition.in_))

    if (
        condition.glob is not None
        or condition.not_glob is not None
        or condition.regex is not None
        or (condition.under is not None)
    ):
        profile = regex_profile(condition.regex) if condition.regex is not None else LINEAR
        if not isinstance(value, str):
            unknown = "type"
        elif len(value) > profile.max_chars:
            # Never run the pattern; the call is denied unless another condition already fails.
            unknown, limit = "too_long", profile.max_chars
        elif _has_dot_dot(value):
            # A '..' segment can climb out of the directory a pattern names ('/srv/work/../etc'
            # matches '/srv/work/*' and '/srv/work(/.*)?'), so no path operator vouches for such a
            # value either way.
            unknown = "dot_dot"
        else:
            path = normalise_path(value)
            # fnmatch compiles '*' so that it cannot backtrack: linear in the value.
            if condition.glob is not None:
                record(fnmatch.fnmatchcase(path, condition.glob))
            if condition.not_glob is not None:
                record(not fnmatch.fnmatchcase(path, condition.not_glob))
            if condition.under is not None:
                if path.startswith("/"):
                    record(_is_under(path, condition.under))
                else:
                    unknown = "relative"
            if condition.regex is not None:
                if profile.nested:
                    unknown = unknown or "unsafe_regex"
                else:
                    record(_compiled(condition.regex).fullmatch(path) is not None)

    if condition.max_len is not None:
        length = _length(value)
        if length is not None:
            record(length <= condition.max_len)
        else:
            unknown = unknown or "type"

    if condition.min is not None or condition.max is not None:
        number = _number(value)
        if number is None:
            unknown = unknown or "type"
        else:
            if condition.min is not None:
                record(number >= condition.min)
            if condition.max is not None:
                record(number <= condition.max)

    if condition.each is not None:
        if not isinstance(value, list):
            unknown = unknown or "type"
        else:
            # Every element must pass: one failing element fails the condition; otherwise the
            # first element that cannot be tested makes it unknown (and names that element).
            element_unknown: _Outcome | None = None
            for index, element in enumerate(cast(list[Any], value)):
                outcome = _check_value(f"{name}[{index}]", condition.each, element)
                if outcome.value is _V.FAILS:
                    record(False)
                    break
                if outcome.value is _V.UNKNOWN and element_unknown is None:
                    element_unknown = outcome
            if element_unknown is not None and unknown is None and not fails:
                unknown, where, limit = element_unknown.why, element_unknown.argument, element_unknown.limit

    if fails:
        return _Outcome(_V.FAILS)
    if unknown is not None:
        return _Outcome(_V.UNKNOWN, where, unknown, limit)
    return _Outcome(_V.HOLDS)


_PERCENT_DOT = re.compile(r"%2e", re.IGNORECASE)
_PERCENT_SEP = re.compile(r"%2f|%5c", re.IGNORECASE)
_REPEATED_SLASH = re.compile(r"(?<!:)//+")


def _has_dot_dot(value: str) -> bool:
    # Servers that take URLs decode '%2e%2e%2f' into '../' after Truss has looked at the text.
    if "%" in value:
        value = _PERCENT_SEP.sub("/", _PERCENT_DOT.sub(".", value))
    return ".." in re.split(r"[/\\]", value)


def normalise_path(value: str) -> str:
    """The text path operators match: repeated ``/`` collapsed (not the ``//`` after a URL's ``scheme:``)
    and ``.`` segments dropped, so ``/etc//passwd`` and ``/etc/./passwd`` meet a rule about ``/etc/passwd``.

    ``..`` is never resolved (a value with a ``..`` segment is not matched at all), nor are symlinks,
    case or percent-encoding: the server's file system alone knows what those mean.
    """
    if "/" not in value:
        return value
    kept = [s for s in _REPEATED_SLASH.sub("/", value).split("/") if s != "."]
    path = "/".join(kept)
    if path in ("", "/") or not path.strip("/"):
        return "/" if value.startswith("/") else "."
    return path


def _is_under(path: str, directory: str) -> bool:
    """``path`` (normalised, absolute) is ``directory`` or below it, compared segment by segment."""
    top = directory.rstrip("/")
    if not top:
        return True
    trimmed = path.rstrip("/") or "/"
    return trimmed == top or trimmed.startswith(top + "/")


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def json_equal(a: Any, b: Any, _depth: int = 0) -> bool:
    """Equality of JSON values: ``true`` is not ``1``, ``1`` is ``1.0``, arrays and objects compare deeply.

    Values nested deeper than a fixed bound compare unequal rather than recursing without end.
    """
    if _depth > _MAX_EQUAL_DEPTH:
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        left, right = cast(Sequence[Any], a), cast(Sequence[Any], b)
        return len(left) == len(right) and all(json_equal(x, y, _depth + 1) for x, y in zip(left, right, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        ma, mb = cast(Mapping[Any, Any], a), cast(Mapping[Any, Any], b)
        return ma.keys() == mb.keys() and all(json_equal(ma[k], mb[k], _depth + 1) for k in ma)
    return False


def _as_mapping(value: object) -> Mapping[str, Any] | None:
    """``value`` as a JSON object, or None. Keys are not checked: lookups by a string key are safe either way."""
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else None


def _length(value: object) -> int | None:
    """The length a ``max_len`` condition tests: of a string, or of an array; None for anything else."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return len(cast(list[Any], value))
    return None


@dataclass(frozen=True)
class Finding:
    """A policy that is valid but probably not what its author meant. ``path`` is the key path."""

    path: str
    message: str


def lint(contract: Contract) -> list[Finding]:
    """Findings for ``truss contract check``: valid policies that will not behave as written.

    - a ``regex`` that nests repetition (never run on arguments, so the rule fails closed);
    - a rule no call can reach, because an earlier rule without argument conditions already
      decides every tool it covers;
    - a rule whose tool glob matches no allowlisted tool (only when no server allowlists ``*``).
    """
    findings: list[Finding] = []
    rules = contract.policy.rules
    known = _allowlisted(contract)
    for index, rule in enumerate(rules):
        for name, condition in _conditions(rule.args):
            if condition.regex is not None and regex_profile(condition.regex).nested:
                findings.append(
                    Finding(
                        f"policy.rules[{index}].args.{name}.regex",
                        f"{condition.regex!r} nests repetition, so Truss never runs it on an argument and the rule "
                        "fails closed; make the inner repetition atomic '(?>...)' or possessive ('*+', '++')",
                    )
                )
        covered = [t for t in known or () if fnmatch.fnmatchcase(t, rule.tool)]
        if known is not None and not covered:
            findings.append(
                Finding(f"policy.rules[{index}].tool", f"{rule.tool!r} matches none of the allowlisted tools")
            )
            continue
        for earlier_index, earlier in enumerate(rules[:index]):
            if earlier.args:
                continue
            shadowed = earlier.tool in (rule.tool, "*") or (
                known is not None and all(fnmatch.fnmatchcase(t, earlier.tool) for t in covered)
            )
            if shadowed:
                findings.append(
                    Finding(
                        f"policy.rules[{index}]",
                        f"never applies: policy rule {earlier_index} ({earlier.tool!r}, {earlier.effect}) "
                        "already decides every tool it covers",
                    )
                )
                break
    return findings


def _conditions(args: Mapping[str, ArgCondition]) -> list[tuple[str, ArgCondition]]:
    """Every condition of a rule with its key path below ``args``, those inside ``each`` too."""
    out: list[tuple[str, ArgCondition]] = []
    for name, condition in args.items():
        path = name
        current: ArgCondition | None = condition
        while current is not None:
            out.append((path, current))
            current, path = current.each, f"{path}.each"
    return out


def _allowlisted(contract: Contract) -> list[str] | None:
    """Every namespaced tool the contract allowlists, or None when a server allowlists '*'."""
    names: list[str] = []
    for server in contract.mcp.servers:
        if "*" in server.allow_tools:
            return None
        names.extend(namespaced(server.name, tool) for tool in server.allow_tools)
    return names
