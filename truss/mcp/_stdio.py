"""The stdio transport: a server's process, its stdin written, its stdout read with bounds.

The SDK's ``stdio_client`` reads a server's stdout by appending each chunk to the line so far and
splitting it again (quadratic: a 20 MB line took 7.6 s, a 50 MB one ended as a timeout), and
holds a line of any length. This transport reads through ``truss.mcp._wire.LineReader`` instead:
linear, bounded, and answering a request at once when its answer is refused. The rest is the
SDK's behaviour, kept on purpose: the process is spawned as the leader of a new session and
process group with the SDK's default environment plus the server's own, its stderr goes to the
given log, and shutdown is the MCP sequence (close stdin, 2 s to exit, then SIGTERM to the group,
2 s, SIGKILL), shielded and bounded. ``truss.mcp._procs`` still ends what is left of the group
afterwards. Linux and other POSIX systems only (as the rest of Truss's process handling).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.abc
import anyio.lowlevel
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from truss.mcp._wire import LineReader, Wire

__all__ = ["stdio_transport"]

_READ_BYTES = 65_536
_EXIT_AFTER_STDIN_S = 2.0
_TERM_GRACE_S = 2.0
_REAP_S = 2.0
_FLUSH_S = 0.5
_POLL_S = 0.01


@asynccontextmanager
async def stdio_transport(params: StdioServerParameters, *, errlog: TextIO, wire: Wire) -> AsyncGenerator[Any]:
    """Spawn the server and yield ``(read_stream, write_stream)`` for the SDK's session."""
    process = await anyio.open_process(
        [params.command, *params.args],
        env=get_default_environment() | (params.env or {}),
        stderr=errlog,
        cwd=params.cwd,
        start_new_session=True,
    )
    # No await between the spawn and the task group, or a cancellation there would leak the process.
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    stdout, stdin = process.stdout, process.stdin
    assert stdout is not None and stdin is not None

    async def reader() -> None:
        lines = LineReader(wire)
        try:
            async with read_writer:
                try:
                    while True:
                        try:
                            chunk = await stdout.receive(_READ_BYTES)
                        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                            return
                        for item in lines.feed(chunk):
                            await read_writer.send(item)
                finally:
                    await _drain(stdout)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the session is gone

    async def writer() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send((text + "\n").encode("utf-8", "replace"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the server stopped reading: the session sees the connection end
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_FLUSH_S):
            await writer_done.wait()
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stdin.aclose()
        if not await _exited_within(process, _EXIT_AFTER_STDIN_S):
            await terminate_posix_process_tree(process, _TERM_GRACE_S)
            await _exited_within(process, _REAP_S)
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stdout.aclose()
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()


async def _drain(stdout: anyio.abc.ByteReceiveStream) -> None:
    """Read and drop what the server still writes, so it never blocks on a full pipe while exiting."""
    with (
        anyio.CancelScope(shield=True),
        contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
    ):
        while True:
            await stdout.receive(_READ_BYTES)


async def _exited_within(process: anyio.abc.Process, seconds: float) -> bool:
    # Not process.wait(): it also waits for the pipes to close, which a grandchild may hold open.
    with anyio.move_on_after(seconds):
        while process.returncode is None:  # noqa: ASYNC110 - nothing signals an exit but polling
            await anyio.sleep(_POLL_S)
        return True
    return False
