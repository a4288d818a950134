"""serve-mcp over stdio, and its wire: only protocol messages on stdout, bounded requests on stdin.

``serve_stdio`` serves one client on this process's stdin/stdout (the principal is the process's).

At start the process's fd 1 is pointed at stderr and fd 0 at the null device for good; the wire
keeps private duplicates. Anything a run prints (a library, a stray ``print``) therefore lands on
stderr, also after the client has gone and runs are still finishing. (The SDK's own
``stdio_server`` restores the descriptors when the connection ends, which is too early here.)

Each inbound line is bounded in size and nesting before the SDK parses it; an oversized or too
deeply nested message gets a JSON-RPC error (with its id when one can be read) instead of silence.

Every request read before the end of input is answered: the SDK's serving loop cancels the
requests still in flight when its input ends, so a client that writes a request and closes its
end at once lost the answer (2 times in 3). The lines end only once every request read has been
answered on the wire (or cancelled by the client, or the wire is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import AsyncIterator
from typing import IO, Any, cast

import anyio
import anyio.from_thread
import anyio.lowlevel

from truss.mcp._serve_core import Principal, ServeLimits, json_depth
from truss.mcp.server import ServeApp, ServeConfig, say, serve_app

__all__ = ["claim_stdio", "serve_stdio"]

_ID_RE = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,200}"|-?\d{1,20})')


class _InFlight:
    """The requests read from stdin and not answered yet, by id."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._idle = anyio.Event()
        self._idle.set()

    def read(self, message: Any) -> None:
        """Note a request the SDK will answer (a well-formed one), or a client's cancellation."""
        if not isinstance(message, dict):
            return
        fields = cast("dict[str, Any]", message)
        if fields.get("jsonrpc") != "2.0":
            return
        method, request_id, params = fields.get("method"), fields.get("id"), fields.get("params")
        if not isinstance(method, str):
            return
        if "id" not in fields:
            if method == "notifications/cancelled" and isinstance(params, dict):
                self._drop(cast("dict[str, Any]", params).get("requestId"))
            return
        if (
            isinstance(request_id, int | str)
            and not isinstance(request_id, bool)
            and (params is None or isinstance(params, dict))
        ):
            key = json.dumps(request_id)
            self._ids[key] = self._ids.get(key, 0) + 1
            self._idle = anyio.Event() if self._idle.is_set() else self._idle

    def wrote(self, text: str) -> None:
        """Note a line written to the client: an answer settles its request."""
        try:
            message: Any = json.loads(text)
        except ValueError:
            return
        if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
            self._drop(cast("dict[str, Any]", message).get("id"))

    def _drop(self, request_id: Any) -> None:
        key = json.dumps(request_id)
        count = self._ids.get(key, 0)
        if count > 1:
            self._ids[key] = count - 1
        else:
            self._ids.pop(key, None)
        if not self._ids:
            self._idle.set()

    def release(self) -> None:
        """Nobody can be answered any more (the wire is gone)."""
        self._ids.clear()
        self._idle.set()

    async def answered(self) -> None:
        await self._idle.wait()


class _Wire:
    """The protocol's stdout: whole lines, one writer at a time."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._lock = anyio.Lock()
        self.in_flight = _InFlight()

    async def write(self, text: str) -> None:
        data = text.encode("utf-8")
        async with self._lock:
            try:
                await anyio.to_thread.run_sync(self._write_flush, data)
            except OSError:
                self.in_flight.release()
                raise
        self.in_flight.wrote(text)

    def _write_flush(self, data: bytes) -> None:
        self._raw.write(data)
        self._raw.flush()

    async def flush(self) -> None:
        return None

    async def error(self, request_id: Any, code: int, message: str) -> None:
        line = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
        with contextlib.suppress(OSError):  # the client is gone; nobody is left to tell
            await self.write(line + "\n")


class _BoundedLines:
    """``async for line in ...``: the stdin lines that are within the limits, as text."""

    def __init__(self, raw: IO[bytes], wire: _Wire, limits: ServeLimits) -> None:
        self._raw = raw
        self._wire = wire
        self._limits = limits

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        limit = self._limits.max_request_bytes
        send, receive = anyio.create_memory_object_stream[bytes](4)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            # A daemon thread, not a worker of anyio's pool: a read blocked on a client that keeps
            # stdin open must not hold the process at exit (after SIGTERM, for example).
            try:
                while True:
                    chunk = self._raw.readline(limit + 1)
                    if not chunk:
                        break
                    anyio.from_thread.run(send.send, chunk, token=token)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError, OSError, ValueError):
                return  # the server stopped reading, or the loop is gone
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(send.close, token=token)  # end of input: the iteration ends

        threading.Thread(target=pump, name="truss-serve-stdin", daemon=True).start()
        async with receive:
            async for line in receive:
                if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
                    head = line[:4096]
                    async for rest in receive:
                        if rest.endswith(b"\n"):
                            break
                    await self._wire.error(_sniff_id(head), -32600, f"request too large: over {limit} bytes")
                    continue
                if not line.strip():
                    continue
                message, problem = self._parsed(line)
                if problem is not None:
                    await self._wire.error(*problem)
                    continue
                self._wire.in_flight.read(message)
                yield line.decode("utf-8", errors="replace")
            # End of input: the SDK would cancel what is still in flight, so end only once it is answered.
            await self._wire.in_flight.answered()

    def _parsed(self, line: bytes) -> tuple[Any, tuple[Any, int, str] | None]:
        depth_limit = self._limits.max_nesting_depth + 2  # the message and its params add two levels
        try:
            message: Any = json.loads(line)
        except RecursionError:
            return None, (_sniff_id(line[:4096]), -32600, f"request nested deeper than {depth_limit} levels")
        except ValueError:
            return None, (None, -32700, "Parse error")
        if json_depth(message, depth_limit) > depth_limit:
            request_id: Any = cast("dict[str, Any]", message).get("id") if isinstance(message, dict) else None
            return None, (request_id, -32600, f"request nested deeper than {depth_limit} levels")
        return message, None


def _sniff_id(head: bytes) -> Any:
    match = _ID_RE.search(head)
    if match is None:
        return None
    try:
        return json.loads(match.group(1))
    except ValueError:
        return None


def claim_stdio(limits: ServeLimits) -> tuple[_BoundedLines, _Wire]:
    """Take fds 0 and 1 for the wire; leave fd 0 reading the null device and fd 1 writing to stderr."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    raw_in = os.fdopen(wire_in, "rb")
    raw_out = os.fdopen(wire_out, "wb")
    wire = _Wire(raw_out)
    return _BoundedLines(raw_in, wire, limits), wire


async def serve_stdio(config: ServeConfig, principal: Principal) -> None:
    """Serve one client on this process's stdin/stdout until it disconnects, then finish the runs.

    Runs the client started keep going after it disconnects (the process waits for them, each
    bounded by its deadline). SIGINT/SIGTERM interrupt them instead (recorded as interrupted).
    """
    from mcp.server.stdio import stdio_server

    lines, wire = claim_stdio(config.limits)
    async with serve_app(config, lambda ctx: principal) as app, anyio.create_task_group() as serving:
        serving.start_soon(_shutdown_on_signal, app)
        # The SDK reads and writes them as the text files it would have opened (readline/write/flush).
        stdin, stdout = cast("anyio.AsyncFile[str]", lines), cast("anyio.AsyncFile[str]", wire)
        async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
            await app.server.run(read, write, app.server.create_initialization_options())
        if app.active_runs:
            say(f"truss serve-mcp: client disconnected; finishing {app.active_runs} run(s)")
        await app.wait_idle()
        serving.cancel_scope.cancel()


async def _shutdown_on_signal(app: ServeApp) -> None:
    import signal

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            say("truss serve-mcp: interrupted; stopping runs (they are recorded as interrupted)")
            await app.shutdown()
            return
