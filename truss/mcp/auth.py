"""Auth flows: how the HTTP connector authenticates to a Streamable HTTP server.

Static headers (``headers = { Authorization = { secret_env = ..., format = ... } }`` in the
contract) are set on the connection's ``httpx2.AsyncClient`` as before. Anything that has to talk
to the server (or an authorization server) to authenticate is an ``httpx2.Auth`` flow: a
generator that may rewrite each request and see each response, which is exactly what the MCP SDK's
OAuth providers (``mcp.client.auth``) are. ``HttpAuth.flow(server, report)`` gives the flow for one server
(None: headers only), and ``HttpAuth.describe(server)`` what it does, as JSON (RFC 8785
canonicalisable, never a credential) recorded in ``session_started`` as the server's ``auth``
(docs/ledger-format.md). ``StaticHeaders``, the default, adds no flow and describes the header
names the contract declares: ``{"kind": "static_headers", "headers": ["Authorization"]}``.

An auth flow is trusted code chosen by the operator or an embedding program. Credentials it holds
must stay out of its description, its exceptions' messages and anything it reports.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx2

from truss.contract import Server
from truss.mcp.launch import Report

__all__ = ["HttpAuth", "StaticHeaders"]


class HttpAuth(Protocol):
    """Gives each HTTP server its auth flow (see the module docstring)."""

    def describe(self, server: Server) -> dict[str, Any]:
        """What this auth does for ``server``, as JSON recorded in ``session_started``."""
        ...

    def flow(self, server: Server, report: Report) -> httpx2.Auth | None:
        """The ``httpx2.Auth`` the connection to ``server`` uses; None: the static headers alone.

        ``report(name, attributes)`` tells the run what happened (a token refreshed, say) as a
        ``truss.events.ServerEvent``.
        """
        ...


class StaticHeaders:
    """The contract's headers, nothing more."""

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "static_headers", "headers": sorted(server.headers)}

    def flow(self, server: Server, report: Report) -> httpx2.Auth | None:
        return None
