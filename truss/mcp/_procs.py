"""Finding and ending the process groups of stdio MCP servers.

The SDK spawns each stdio server as the leader of a new session and process group
(``start_new_session=True``) but does not expose its pid. Truss puts a unique marker in the
child's environment, and right after the spawn finds the child of this process carrying it
(``/proc``). When a server's connection ends, whatever is left of its group is ended:
SIGTERM, a short grace, SIGKILL. The SDK's own shutdown only signals the group when the leader
lingers, so without this a server's grandchildren outlive a graceful exit.

This module does not decide when servers end; ``truss.mcp.client`` calls it on every exit path.
On systems without ``/proc`` the pid is unknown and only the SDK's shutdown applies.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import anyio

__all__ = ["MARKER_ENV", "end_group", "find_marked_child", "group_alive", "wait_gone"]

MARKER_ENV = "TRUSS_MCP_SPAWN"

_PROC = Path("/proc")
_GRACE_S = 1.0
_POLL_S = 0.01


def find_marked_child(marker: str) -> int | None:
    """The pid of this process's child whose environment holds ``MARKER_ENV=marker``.

    First from ``/proc/self/task/*/children`` (a few small reads); the kernel documents that
    list as possibly incomplete while children come and go, so a miss falls back to scanning
    every process's parent id.
    """
    needle = f"{MARKER_ENV}={marker}".encode()
    for candidates in (_listed_children, _scanned_children):
        for pid in candidates():
            try:
                environ = (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in environ:
                return pid
    return None


def _listed_children() -> list[int]:
    found: list[int] = []
    try:
        for task in (_PROC / "self" / "task").iterdir():
            found.extend(int(p) for p in (task / "children").read_text().split())
    except (OSError, ValueError):
        return []
    return found


def _scanned_children() -> list[int]:
    if not _PROC.is_dir():
        return []
    me = os.getpid()
    found: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def end_group(pgid: int) -> None:
    """End every process left in group ``pgid``: SIGTERM, up to 1 s of grace, then SIGKILL.

    Safe after the leader is gone: Linux never hands out a pid that is still some group's id,
    so the signal reaches only that server's leftovers. Runs shielded so that a cancelled run
    still cleans up.
    """
    with anyio.CancelScope(shield=True):
        if not group_alive(pgid):
            return
        _signal_group(pgid, signal.SIGTERM)
        if await _gone_within(pgid, _GRACE_S):
            return
        _signal_group(pgid, signal.SIGKILL)
        # A killed process still takes a moment to die; return once it has, so callers (and
        # tests) that look right after see no survivor.
        await _gone_within(pgid, _GRACE_S)


async def wait_gone(pgid: int, seconds: float) -> bool:
    """Wait (at most ``seconds``) until group ``pgid`` has ended by itself; True when it has."""
    return await _gone_within(pgid, seconds)


async def _gone_within(pgid: int, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        # Nothing signals a process group's end; polling with a bound is the only way.
        while group_alive(pgid) and not _only_zombies(pgid):  # noqa: ASYNC110
            await anyio.sleep(_POLL_S)
        return True
    return False


def _only_zombies(pgid: int) -> bool:
    """True when every remaining member of the group is a zombie (dead, waiting to be reaped)."""
    if not _PROC.is_dir():
        return False
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
        except (OSError, ValueError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True
