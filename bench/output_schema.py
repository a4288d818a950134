"""Checking a result against its tool's ``outputSchema``: Truss's bounded check vs the SDK's.

The baseline is what the SDK did (and Truss turns off): ``jsonschema``'s validator for the schema
(compiled once, as the SDK caches it), applied on the event loop. Truss's check
(``truss.mcp._schema.check_output``) uses RE2 for patterns, meters the work and runs small checks
on the loop, larger ones in a worker thread. Measured in the same run:

1. a small result (two members, one pattern): microseconds per check, median of ``--checks``;
2. an honest large result (25,000 objects, 1.4 MB): seconds per check, and the longest the event
   loop went without running (a ticker task that wakes every millisecond measures the gap);
3. the hostile one: ``^(a+)+$`` against 24 a's and a ``!`` (the SDK's time grows 2x per ``a``;
   the issue's 34 would take hours): seconds, and the loop's longest gap.

Usage: ``python bench/output_schema.py [--checks N]``. No peers needed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jsonschema import Draft202012Validator  # noqa: E402
from referencing import Registry  # noqa: E402

from truss._errors import ToolCallError  # noqa: E402
from truss.mcp._schema import SchemaChecks, check_output  # noqa: E402
from truss.tools import MountedTool  # noqa: E402


def _tool(schema: dict[str, Any], pin: str) -> MountedTool:
    definition = {"name": "t", "inputSchema": {"type": "object"}, "outputSchema": schema}
    return MountedTool(server="s", tool="t", definition=definition, pin=pin)


def _sdk(schema: dict[str, Any]) -> Callable[[Any], Awaitable[None]]:
    validator = Draft202012Validator(schema, registry=Registry())

    async def check(value: Any) -> None:
        next(iter(validator.iter_errors(value)), None)

    return check


def _truss(schema: dict[str, Any], pin: str) -> Callable[[Any], Awaitable[None]]:
    checks, tool = SchemaChecks(), _tool(schema, pin)

    async def check(value: Any) -> None:
        with contextlib.suppress(ToolCallError):  # the hostile case fails its check: the time is what counts
            await check_output(checks, tool, {"content": [], "structuredContent": value}, timeout_s=120)

    return check


async def _with_gap(check: Callable[[Any], Awaitable[None]], value: Any) -> tuple[float, float]:
    """(seconds the check took, longest gap in the event loop's ticks meanwhile)."""
    gap = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal gap
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gap = max(gap, now - last)
            last = now

    took = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.01)
        start = time.perf_counter()
        await check(value)
        took = time.perf_counter() - start
        done.set()
    return took, gap


async def main(checks: int) -> None:
    small_schema = {
        "type": "object",
        "properties": {"sum": {"type": "number"}, "label": {"type": "string", "pattern": "^[a-z]+$"}},
        "required": ["sum"],
    }
    small = {"sum": 3, "label": "abc"}
    for name, check in (("sdk", _sdk(small_schema)), ("truss", _truss(small_schema, "small"))):
        await check(small)
        times: list[float] = []
        for _ in range(checks):
            start = time.perf_counter()
            await check(small)
            times.append(time.perf_counter() - start)
        print(f"small result     {name:5}  {statistics.median(times) * 1e6:8.1f} µs per check (median of {checks})")

    big_schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "name": {"type": "string", "pattern": "^item"}},
            "required": ["id", "name"],
        },
    }
    big = [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(25_000)]
    for name, check in (("sdk", _sdk(big_schema)), ("truss", _truss(big_schema, "big"))):
        took, gap = await _with_gap(check, big)
        print(f"1.4 MB result    {name:5}  {took:8.2f} s, longest event-loop gap {gap * 1000:8.1f} ms")

    hostile_schema = {"type": "object", "properties": {"echo": {"type": "string", "pattern": "^(a+)+$"}}}
    hostile = {"echo": "a" * 24 + "!"}
    for name, check in (("sdk", _sdk(hostile_schema)), ("truss", _truss(hostile_schema, "hostile"))):
        took, gap = await _with_gap(check, hostile)
        print(f"^(a+)+$, 24 a's  {name:5}  {took:8.3f} s, longest event-loop gap {gap * 1000:8.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--checks", type=int, default=2000)
    anyio.run(main, parser.parse_args().checks)
