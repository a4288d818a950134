"""``SandboxLauncher``: the launcher (``truss.mcp.launch``) that confines each stdio server its contract confines.

A server's effective contract says whether it is confined (``Server.sandbox``, decided when the
contract loaded from the contract's table and the operator's level and baseline:
``truss.contract.sandbox``). For a confined server the launcher

- describes, before the start, the sandbox it will build (``plan_for``: binds, masks, network,
  hosts, limits, the bwrap version; no secret, no per-run path) as ``{"kind": "sandbox",
  "sandbox": <description>}``: recorded in ``session_started`` and part of each mounted tool's
  identity for pins and the memo (``truss._memo``), so a result made unconfined never answers a
  confined call;
- starts it with ``confined(...)`` and hands back its ``Spawn`` as the ``Launch``'s confinement
  (limit hits, a failed start's diagnosis);
- reports each connection attempt through the egress proxy as ``sandbox_egress`` (the attempt's
  fields, or a flood summary's with ``summary: true``), which the session records as signed
  entries, and ``sandbox_started`` (whether cgroups or only rlimits enforce the limits), or
  ``sandbox_unconfined`` when an optional profile runs without bwrap.

Any other server runs as declared (``{"kind": "plain"}``). Where bwrap cannot run, a ``required``
profile refuses to start the server (``SandboxError`` naming the cause and the remedy); an
optional one runs unconfined and says so in its description and a report. Truss's home, the
identity key and the ledger (``protected``) are never visible inside.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from mcp.client.stdio import get_default_environment

from truss._clock import Clock
from truss._errors import SandboxError, ServerStartError
from truss._sandbox_profile import Profile
from truss.contract import Server
from truss.ledger.canonical import canonical
from truss.mcp._procs import MARKER_ENV
from truss.mcp.launch import Launch, Report
from truss.mcp.sandbox._bwrap import Bwrap, find_bwrap
from truss.mcp.sandbox._confine import confined, plan_for
from truss.mcp.sandbox._proxy import EgressSummary, SandboxEvent

__all__ = ["SandboxLauncher", "profile_of"]

_RUNTIME_KEYS = ("cgroups", "rlimits_only")  # decided when the sandbox is built, not in its plan


def profile_of(server: Server) -> Profile | None:
    """The profile a stdio server is confined by, or None when it runs unconfined."""
    if server.transport != "stdio" or server.sandbox is None:
        return None
    return server.sandbox.profile()


def egress_record(event: SandboxEvent) -> dict[str, Any]:
    """What a ``sandbox_egress`` entry holds for one attempt or one flood summary (no payload, ever)."""
    body = {k: v for k, v in event.as_json().items() if v is not None}
    if isinstance(event, EgressSummary):
        body["summary"] = True
    return body


class SandboxLauncher:
    """Confines each stdio server whose effective contract says so; runs the others as declared.

    Build it with ``await SandboxLauncher.create(servers, protected=...)``, which checks bwrap once
    when some server needs it. ``protected``: paths never shown inside (Truss's home, the identity
    key, the ledger database and its ``-wal``/``-shm``/``-journal`` files, the run's logs).
    """

    def __init__(
        self,
        *,
        bwrap: Bwrap | None = None,
        unusable: dict[str, SandboxError] | None = None,
        protected: Sequence[str | os.PathLike[str]] = (),
        clock: Clock | None = None,
    ) -> None:
        self.bwrap = bwrap
        self.unusable = dict(unusable or {})  # server -> why bwrap cannot run for it
        # Absolute: a relative home (./.truss) must be masked as surely as an absolute one.
        self.protected = tuple(os.path.abspath(p) for p in protected)
        self.clock = clock
        self._described: dict[str, dict[str, Any]] = {}

    @classmethod
    async def create(
        cls,
        servers: Iterable[Server],
        *,
        protected: Sequence[str | os.PathLike[str]] = (),
        clock: Clock | None = None,
    ) -> SandboxLauncher:
        """A launcher for these servers; bwrap is found and checked only when one of them is confined."""
        bwrap: Bwrap | None = None
        unusable: dict[str, SandboxError] = {}
        for server in servers:
            if profile_of(server) is not None:
                try:  # checked once per process; the error names each server
                    bwrap = await find_bwrap(server=server.name)
                except SandboxError as exc:
                    unusable[server.name] = exc
        return cls(bwrap=bwrap, unusable=unusable, protected=protected, clock=clock)

    def _environment(self, server: Server, env: dict[str, str] | None = None) -> dict[str, str]:
        """The server's whole environment: what the SDK gives every stdio server, then Truss's."""
        if env is None:
            # Before the start only the names of secrets matter (the description holds names only).
            env = {**server.env, **dict.fromkeys(server.secret_env, ""), MARKER_ENV: ""}
        return {**get_default_environment(), **env}

    def describe(self, server: Server) -> dict[str, Any]:
        profile = profile_of(server)
        if profile is None:
            return {"kind": "plain"}
        known = self._described.get(server.name)
        if known is not None:
            return known
        unusable = self.unusable.get(server.name)
        if unusable is not None or self.bwrap is None:
            if unusable is None:
                unusable = SandboxError(
                    f"cannot confine MCP server {server.name!r}: this launcher was made without a checked bwrap",
                    remedy="Build the launcher with SandboxLauncher.create(servers)",
                    server=server.name,
                    cause="bwrap_missing",
                )
            if profile.required:
                raise unusable
            cause = str(unusable.fields.get("cause"))
            sandbox: dict[str, Any] = {"v": 1, "confined": False, "fallback": cause, "profile": profile.as_json()}
        else:
            assert server.command is not None
            plan = plan_for(
                profile,
                server.command,
                server.args,
                self._environment(server),
                server.cwd or os.getcwd(),
                server=server.name,
                bwrap=self.bwrap,
                protected=self.protected,
            )
            sandbox = plan.description
        described = {"kind": "sandbox", "sandbox": sandbox}
        self._described[server.name] = described
        return described

    @asynccontextmanager
    async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
        profile = profile_of(server)
        if profile is None:
            yield declared
            return
        described = self.describe(server)["sandbox"]

        def sink(event: SandboxEvent) -> None:
            report("sandbox_egress", egress_record(event))

        async with confined(
            profile,
            declared.command,
            declared.args,
            self._environment(server, dict(declared.env)),
            declared.cwd,
            server=server.name,
            on_event=sink,
            protected=self.protected,
            clock=self.clock,
            bwrap=self.bwrap,
        ) as spawn:
            built = {k: v for k, v in spawn.description.items() if k not in _RUNTIME_KEYS}
            if canonical(built) != canonical(described):
                # What is recorded must be what runs: a plan that changed between the two is refused.
                raise ServerStartError(
                    f"the sandbox of MCP server {server.name!r} changed between its description and its start",
                    remedy="Start the run again; if this repeats, something changes the server's files as it starts",
                    server=server.name,
                    cause="sandbox_changed",
                )
            if spawn.confined:
                report("sandbox_started", {k: spawn.description[k] for k in _RUNTIME_KEYS if k in spawn.description})
            else:
                report("sandbox_unconfined", {"fallback": spawn.fallback})
            yield Launch(spawn.command, tuple(spawn.args), spawn.env, spawn.cwd, confinement=spawn)
