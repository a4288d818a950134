"""Launchers: what command line actually runs for a stdio server (the place a sandbox wraps).

The stdio connector never spawns a server's declared command directly: it asks a ``Launcher``.
``Launcher.launch(server, declared, report)`` is an async context manager around the server's
whole life. On entry it may start helpers (a sandbox's egress proxy, say) and yields the ``Launch``
to spawn: the declared command line as is, or wrapped (``bwrap ... -- command args``), with the
environment Truss built for the server (its literal ``env``, its ``secret_env`` values and Truss's
spawn marker; a launcher passes the marker through, so that Truss still finds and ends the
server's process group). On exit, after the server's processes were ended, it tears its helpers
down. ``report(name, attributes)`` tells the run what happened (an egress decision, a limit hit):
each call becomes a ``truss.events.ServerEvent`` of the run.

``Launcher.describe(server)`` says what the launcher does for that server as JSON (RFC 8785
canonicalisable: strings, integers, booleans, lists, objects; never a secret), recorded in
``session_started`` as the server's ``launcher`` (docs/ledger-format.md), so the record says how
each server was run. ``PlainLauncher``, the default, runs the declared command: ``{"kind": "plain"}``.

A launcher that confines the server (``truss.mcp.sandbox.SandboxLauncher``) hands back, with the
``Launch``, its ``Confinement``: which kernel limits the server ran into (a call during which one
was reached fails with ``cause="sandbox_limit"``) and, after a failed start, what the sandbox
lacked (added to the start error).

A launcher is trusted code chosen by the operator or an embedding program (never by a contract's
untrusted inputs). This module does not spawn anything itself; ``truss.mcp._connection`` does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from truss.contract import Server

__all__ = ["Confinement", "Launch", "Launcher", "LimitReached", "PlainLauncher", "Report"]

Report = Callable[[str, Mapping[str, Any]], None]


class LimitReached(Protocol):
    """A kernel limit a confined server ran into: ``limit`` (``processes``, ``memory``, ``cpu``,
    ``file_size``) and the ``evidence`` (a counter or signal; it changes when the limit is hit again)."""

    @property
    def limit(self) -> str: ...

    @property
    def evidence(self) -> str: ...


class Confinement(Protocol):
    """What a confining launcher can tell about a server it started (readable after the server ended)."""

    def limit_hits(self) -> Sequence[LimitReached]:
        """The limits reached so far (cumulative)."""
        ...

    def diagnose(self) -> str | None:
        """After a failed start: why, as far as the confinement can tell (None: nothing to add)."""
        ...


@dataclass(frozen=True)
class Launch:
    """A command line to spawn: ``command`` (looked up on the child's ``PATH``), ``args``, the
    child's whole environment ``env``, and its working directory ``cwd`` (None: Truss's);
    ``confinement`` when the launcher confines the server."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    confinement: Confinement | None = None


class Launcher(Protocol):
    """Decides what runs for each stdio server (see the module docstring)."""

    def describe(self, server: Server) -> dict[str, Any]:
        """What this launcher does for ``server``, as JSON recorded in ``session_started``."""
        ...

    def launch(self, server: Server, declared: Launch, report: Report) -> AbstractAsyncContextManager[Launch]:
        """Around the server's life: enter -> helpers started, the ``Launch`` to spawn; exit -> torn down."""
        ...


class PlainLauncher:
    """Runs the command as the contract declares it."""

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "plain"}

    @asynccontextmanager
    async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
        yield declared
