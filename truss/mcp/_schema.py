"""A tool's ``outputSchema`` applied to its result, in bounded time, off the event loop.

The server sends both the schema and the result, so both are untrusted; the check must end, and
nothing else may wait for it. The SDK checks on the event loop with ``jsonschema`` as it is, so
one pattern such as ``^(a+)+$`` against 34 a's and a ``!`` stopped everything (the run's deadline,
SIGINT, SIGTERM, and under serve-mcp every other principal's requests). Truss turns the SDK's
check off (``truss.mcp._connection``) and runs this one instead, which differs in four ways:

1. every regular expression the schema holds (``pattern``, ``patternProperties``, and the ones
   ``additionalProperties`` and ``unevaluatedProperties`` consult) runs on RE2
   (``truss._regex.linear_regex``), in time linear in the text; a pattern RE2 refuses
   (look-around, back-references) fails the check rather than fall back to backtracking;
2. the work is metered: each keyword applied costs a step, ``enum``, ``const`` and
   ``uniqueItems`` compare canonical bytes and cost steps by their size (``jsonschema``'s own
   ``uniqueItems`` is quadratic), and a check past ``SCHEMA_STEP_BUDGET`` fails;
3. every subschema is applied with the root's draft (``jsonschema`` would switch to its stock,
   unmetered classes at a nested ``$schema``), and ``$ref`` resolves only inside the schema and to
   the bundled meta-schemas, never over the network;
4. it runs in a worker thread, so the event loop keeps serving while it works; the caller bounds
   it by the call's time left, and a check abandoned that way stops at its next step. A small
   result of a schema already compiled is first checked on the event loop with a budget of
   ``INLINE_STEPS`` (a thread hop would cost more than the check): one that needs more starts
   again in the thread.

A check that fails for any reason is a ``ToolCallError`` with ``cause="invalid_result"``: the
server's result or its schema is at fault, and the run goes on. What this module does not do: check
``format`` (annotation-only, as the SDK does), or check ``isError`` results (never checked).
"""

from __future__ import annotations

import threading
import types as pytypes
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.to_thread

from truss._errors import ToolCallError
from truss._regex import NotLinearError, linear_regex
from truss.ledger.canonical import CanonicalError, canonical
from truss.tools import MountedTool

__all__ = ["INLINE_STEPS", "SCHEMA_STEP_BUDGET", "SchemaChecks", "check_output"]

SCHEMA_STEP_BUDGET = 1_000_000
"""Steps one check may take: keywords applied, plus one per 64 bytes that ``enum``, ``const``,
``uniqueItems`` and patterns read. An honest 1.4 MB result of 25,000 small objects takes about
275,000 (``jsonschema`` applies some 50,000 keywords a second on a loaded 2-core machine, so the
call's time left usually ends a hostile check first)."""

INLINE_STEPS = 500
"""Steps a check may take on the event loop (a few milliseconds at most) before it moves to a thread."""

_INLINE_NODES = 200
_BYTES_PER_STEP = 64
_MAX_DETAIL_CHARS = 160
_SCHEMA_MODULES = ("jsonschema._keywords", "jsonschema._legacy_keywords", "jsonschema._utils")


class _Refused(Exception):
    """Raised inside a check to stop it: ``why`` says what ended it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class _Meter:
    left: int
    abandoned: bool = False
    exhausted: bool = False


_LOCAL = threading.local()


def _charge(steps: int) -> None:
    meter: _Meter | None = getattr(_LOCAL, "meter", None)
    if meter is None:
        return
    meter.left -= steps
    if meter.abandoned:
        raise _Refused("abandoned")
    if meter.left < 0:
        meter.exhausted = True
        raise _Refused(f"the check took more than {SCHEMA_STEP_BUDGET:,} steps")


class _LinearRe:
    """What ``jsonschema``'s keyword code calls ``re``: searches on RE2, metered by text size."""

    @staticmethod
    def search(pattern: str, string: str, flags: int = 0) -> bool:
        if flags:
            raise _Refused("a regular expression with flags")
        _charge(1 + (len(string) + len(pattern)) // _BYTES_PER_STEP)
        try:
            return linear_regex(pattern).search(string)
        except NotLinearError as exc:
            raise _Refused(f"pattern {pattern[:60]!r} cannot be matched in linear time ({exc.reason})") from None


def _code_names(code: pytypes.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _code_names(const)
    return names


def _is_in(value: Any, functions: set[Any]) -> bool:
    return isinstance(value, pytypes.FunctionType) and value in functions


def _rebound_functions() -> dict[Any, Any]:
    """Copies of ``jsonschema``'s functions that reach ``re`` (directly or through each other),
    whose ``re`` is ``_LinearRe``: original function -> copy. Nothing of ``jsonschema`` is changed."""
    import importlib

    modules = [importlib.import_module(name) for name in _SCHEMA_MODULES]
    functions: dict[Any, tuple[Any, set[str]]] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, pytypes.FunctionType) and value.__module__ == module.__name__:
                functions[value] = (module, _code_names(value.__code__))
    tainted = {fn for fn, (_, names) in functions.items() if "re" in names}
    grew = True
    while grew:
        grew = False
        for fn, (_, names) in functions.items():
            if fn in tainted:
                continue
            if any(_is_in(fn.__globals__.get(name), tainted) for name in names):
                tainted.add(fn)
                grew = True
    spaces: dict[str, dict[str, Any]] = {}
    copies: dict[Any, Any] = {}
    for fn in tainted:
        module = functions[fn][0]
        space = spaces.setdefault(module.__name__, {**vars(module), "re": _LinearRe})
        copy = pytypes.FunctionType(fn.__code__, space, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__ = fn.__kwdefaults__
        copies[fn] = copy
    for space in spaces.values():  # calls between the copies reach the copies
        for name, value in list(space.items()):
            if isinstance(value, pytypes.FunctionType) and value in copies:
                space[name] = copies[value]
    return copies


def _canonical_size(value: Any) -> bytes:
    try:
        data = canonical(value)
    except (CanonicalError, RecursionError):
        raise _Refused("a value with no canonical form") from None
    _charge(1 + len(data) // _BYTES_PER_STEP)
    return data


def _keywords(error_type: Any) -> dict[str, Callable[..., Iterator[Any]]]:
    """``enum``, ``const`` and ``uniqueItems`` by canonical bytes (JSON Schema's equality: ``1 == 1.0``,
    ``true != 1``, member order ignored), in time linear in what they compare."""

    def enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[Any]:
        mine = _canonical_size(instance)
        choices = cast(list[Any], enums) if isinstance(enums, list) else [enums]
        if not any(_canonical_size(choice) == mine for choice in choices):
            yield error_type(f"the value is not one of the {len(choices)} values of the schema's enum")

    def const(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if _canonical_size(instance) != _canonical_size(value):
            yield error_type("the value is not the schema's const")

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if unique is True and isinstance(instance, list):
            seen: set[bytes] = set()
            for index, item in enumerate(cast(list[Any], instance)):
                key = _canonical_size(item)
                if key in seen:
                    yield error_type(f"item {index} repeats an earlier item (uniqueItems)")
                    return
                seen.add(key)

    return {"enum": enum, "const": const, "uniqueItems": unique_items}


def _metered(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def apply(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _charge(1)
        return keyword(validator, value, instance, schema)

    return apply


@dataclass
class _Checker:
    """One schema, compiled into a metered validator (or the reason it cannot be)."""

    validator: Any = None
    problem: str | None = None


_LOCK = threading.Lock()
_REBOUND: dict[Any, Any] = {}


def _compile(schema: Any) -> _Checker:
    import importlib

    # jsonschema and referencing ship no complete type information: handled as Any here only.
    validators: Any = importlib.import_module("jsonschema.validators")
    exceptions: Any = importlib.import_module("jsonschema.exceptions")
    referencing: Any = importlib.import_module("referencing")
    attrs: Any = importlib.import_module("attrs")
    with _LOCK:
        if not _REBOUND:
            _REBOUND.update(_rebound_functions())
    if not isinstance(schema, dict):
        return _Checker(problem="the outputSchema is not a JSON object")
    base: Any = validators.validator_for(schema, default=validators.Draft202012Validator)
    replaced = _keywords(exceptions.ValidationError)
    table: dict[str, Any] = {}
    for name, keyword in cast(dict[str, Any], base.VALIDATORS).items():
        table[name] = _metered(replaced.get(name) or _REBOUND.get(keyword, keyword))
    metered: Any = validators.extend(base, validators=table)
    members: list[tuple[str, str]] = [(m.name, m.alias) for m in attrs.fields(metered) if m.init]

    def evolve(self: Any, **changes: Any) -> Any:
        # Always this class: the stock ``evolve`` switches to an unmetered one at a nested ``$schema``.
        changes.setdefault("schema", self.schema)
        for name, alias in members:
            if alias not in changes:
                changes[alias] = getattr(self, name)
        return metered(**changes)

    metered.evolve = evolve
    registry: Any = referencing.Registry()  # refs resolve inside the schema and to the bundled meta-schemas only
    checker: Any = metered(metered.META_SCHEMA, registry=registry)
    problem: Any = next(iter(checker.iter_errors(schema)), None)
    if problem is not None:
        return _Checker(problem=f"the outputSchema is not a valid JSON Schema ({_short(str(problem.message))})")
    return _Checker(validator=metered(schema, registry=registry))


def _short(text: str) -> str:
    flat = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return flat if len(flat) <= _MAX_DETAIL_CHARS else flat[: _MAX_DETAIL_CHARS - 3] + "..."


@dataclass
class SchemaChecks:
    """Compiled output schemas of one connection's tools, by pin (a pin names one definition)."""

    checkers: dict[str, _Checker] = field(default_factory=dict[str, _Checker])


def _run(checks: SchemaChecks, tool: MountedTool, structured: Any, meter: _Meter) -> str | None:
    """The check itself, in a worker thread: None when the result conforms, else why not."""
    _LOCAL.meter = meter
    try:
        checker = checks.checkers.get(tool.pin)
        if checker is None:
            checker = _compile(tool.definition.get("outputSchema"))
            checks.checkers[tool.pin] = checker
        if checker.problem is not None:
            return checker.problem
        error = next(iter(checker.validator.iter_errors(structured)), None)
        if error is None:
            return None
        where = "".join(f"/{part}" for part in error.absolute_path) or "/"
        return f"structuredContent at {_short(where)} does not conform ({error.validator}: {_short(error.message)})"
    except _Refused as exc:
        return exc.why
    except RecursionError:
        return "the schema or the result nests too deeply to check"
    except Exception as exc:  # a broken schema makes jsonschema raise all sorts; each one is the server's fault
        return f"the outputSchema could not be applied ({type(exc).__name__})"
    finally:
        _LOCAL.meter = None


def _small(value: Any) -> bool:
    """True when ``value`` has at most ``_INLINE_NODES`` values and strings (cheap: stops early)."""
    stack: list[Any] = [value]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > _INLINE_NODES or (isinstance(item, str) and len(item) > 4096):
            return False
        if isinstance(item, dict):
            stack.extend(cast(dict[str, Any], item).values())
        elif isinstance(item, list):
            stack.extend(cast(list[Any], item))
    return True


async def check_output(checks: SchemaChecks, tool: MountedTool, wire: Mapping[str, Any], *, timeout_s: float) -> None:
    """Check a result (wire form, ``_meta`` removed) against ``tool``'s ``outputSchema``; raise
    ``ToolCallError(cause="invalid_result")`` when it does not conform or the check cannot finish
    within ``timeout_s`` (module docstring). Results marked ``isError`` and tools without an
    output schema pass at once."""
    if wire.get("isError") or tool.definition.get("outputSchema") is None:
        return
    if "structuredContent" not in wire:
        problem: str | None = "it has an outputSchema but the result has no structuredContent"
    else:
        structured = wire["structuredContent"]
        problem = None
        done = False
        if tool.pin in checks.checkers and _small(structured):
            inline = _Meter(INLINE_STEPS)
            problem = _run(checks, tool, structured, inline)
            done = not inline.exhausted
        if not done:
            meter = _Meter(SCHEMA_STEP_BUDGET)
            problem = f"the check did not finish within the call's time ({timeout_s:g} s)"
            with anyio.move_on_after(max(timeout_s, 0.0)):
                try:
                    problem = await anyio.to_thread.run_sync(
                        _run, checks, tool, structured, meter, abandon_on_cancel=True
                    )
                finally:
                    meter.abandoned = True  # an abandoned check stops at its next step
    if problem is not None:
        raise ToolCallError(
            f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result that fails its outputSchema: "
            f"{problem}",
            remedy="The server's result or its outputSchema is wrong; report it upstream",
            server=tool.server,
            tool=tool.tool,
            cause="invalid_result",
        )
