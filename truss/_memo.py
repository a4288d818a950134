"""Cross-run memo: find an earlier recorded result of an identical call within a time window.

A tool with ``memo = "1h"`` in its ``[[mcp.servers.tools]]`` settings may be answered from the
ledger instead of its server: the gate asks ``MemoIndex.lookup`` for the newest ``mcp_tool_call``
of the same namespaced tool, with the same tool pin, the same canonical (recorded) arguments and
a server declared the same way (transport, command, args, cwd, env, url, the names of its
credentials: secret_env, headers, and its elicitation policy) and reached the same way (the ``launcher`` and ``auth``
descriptions ``session_started`` recorded for it: a sandbox or an account changes the answer; an
OAuth server by its OAuth identity, issuer and client id),
recorded no longer ago than the TTL, that succeeded (no ``isError``, no failure) and whose
result payload is still stored, in a session of the same
principal (serve-mcp's callers never see each other's results; sessions without a principal,
``truss run``, share among themselves). Any such session counts, this one included.

How: entries are appended in time order, so the first log index inside the window is found by
bisection over ``read_range`` (a few reads), and only the window is scanned. The identity of the
server that produced a candidate is read from that session's ``session_started`` (cached).

What this module does not do: decide whether memo applies (the gate does: only for tools that
opt in and only for calls whose arguments held no redacted secret), charge budgets, or write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, cast

from truss.contract import Contract
from truss.ledger.canonical import canonical
from truss.ledger.entry import StoredEntry
from truss.tools import MountedTool

__all__ = ["MemoIndex", "MemoSource", "server_identity"]

# The credential *names* count too: a result one account received must not answer another's call.
# So does the elicitation policy: a result the server gave after an accepted form must not answer a
# call whose contract would have declined it.
_IDENTITY_KEYS = ("transport", "command", "args", "cwd", "env", "url", "secret_env", "headers", "elicitation")
_REACHED_KEYS = ("launcher", "auth")  # from session_started.servers: how the server was reached


def server_identity(server: Mapping[str, Any] | None, reached: Mapping[str, Any] | None = None) -> bytes | None:
    """The canonical bytes of what makes two declarations the same server (None: unknown)."""
    if server is None:
        return None
    identity = {k: server[k] for k in _IDENTITY_KEYS if k in server}
    identity.update(
        {f"reached_{k}": _reached(reached[k]) for k in _REACHED_KEYS if reached is not None and k in reached}
    )
    return canonical(identity)


def _reached(description: Any) -> Any:
    """How a server was reached, for the memo. An OAuth description (truss.mcp.oauth) counts by its
    kind, grant and ``identity`` (issuer, client id) only: its scopes and expiry change with every
    refresh, and one account's result may answer the same account's later call."""
    if isinstance(description, dict):
        oauth = cast(dict[str, Any], description)
        if oauth.get("kind") == "oauth" and "identity" in oauth:
            return {"kind": "oauth", "grant": oauth.get("grant"), "identity": oauth["identity"]}
    return cast(Any, description)


class MemoSource(Protocol):
    """The reads the memo makes of a store (every ``LedgerStore`` has them)."""

    def tree_size(self) -> int: ...

    def read_range(self, start: int, stop: int) -> Iterator[StoredEntry]: ...

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]: ...

    def blob(self, ref: str) -> bytes | None: ...


class MemoIndex:
    """Looks up memo hits in one store for one contract (the gate keeps one per run)."""

    def __init__(self, store: MemoSource, contract: Contract, *, session: str | None = None) -> None:
        self._store = store
        self._contract = contract
        self._session = session  # the asking session: only results of its principal may answer it
        self._identities: dict[str, dict[str, bytes | None]] = {}  # session -> server name -> identity
        self._principals: dict[str, bytes | None] = {}  # session -> canonical principal (None: none)

    def lookup(self, tool: MountedTool, args_ref: str, *, now_ms: int, ttl_ms: int) -> StoredEntry | None:
        """The newest reusable ``mcp_tool_call`` of this call within ``ttl_ms`` before ``now_ms``, or None."""
        mine = self._contract.mcp.server(tool.server)
        if mine is None:
            return None
        # This session's own record says how its server was reached; without one, the declaration alone.
        identity = self._identity(self._session, tool.server) if self._session is not None else None
        if identity is None:
            identity = server_identity(mine.model_dump(mode="json", by_alias=True, exclude_none=True))
        size = int(self._store.tree_size())
        start = self._first_at_or_after(now_ms - ttl_ms, size)
        best: StoredEntry | None = None
        for entry in self._store.read_range(start, size):
            if entry.kind != "mcp_tool_call" or entry.ts < now_ms - ttl_ms:
                continue
            body: Mapping[str, Any] = entry.body
            if body.get("tool") != tool.name or body.get("pin") != tool.pin or body.get("args") != args_ref:
                continue
            if body.get("is_error") is True or "failure" in body:
                continue
            if self._identity(entry.session, tool.server) != identity:
                continue
            if self._session is not None and self._principal(entry.session) != self._principal(self._session):
                continue
            if self._store.blob(str(body.get("result"))) is None:  # erased: nothing to answer with
                continue
            best = entry
        return best

    def _first_at_or_after(self, ts: int, size: int) -> int:
        low, high = 0, size
        while low < high:
            middle = (low + high) // 2
            [entry] = list(self._store.read_range(middle, middle + 1))
            if entry.ts < ts:
                low = middle + 1
            else:
                high = middle
        return low

    def _principal(self, session: str) -> bytes | None:
        if session not in self._principals:
            first = next(iter(self._store.read_session(session)), None)
            principal = first.body.get("principal") if first is not None else None
            self._principals[session] = None if principal is None else canonical(principal)
        return self._principals[session]

    def _identity(self, session: str, server: str) -> bytes | None:
        known = self._identities.get(session)
        if known is None:
            known = {}
            first = next(iter(self._store.read_session(session)), None)
            effective = _as_dict(first.body.get("effective")) if first is not None else None
            mcp = _as_dict(effective.get("mcp")) if effective is not None else None
            servers: Any = mcp.get("servers") if mcp is not None else None
            reached = _as_dict(first.body.get("servers")) if first is not None else None
            for item in cast(list[Any], servers) if isinstance(servers, list) else []:
                declared = _as_dict(item)
                if declared is not None and isinstance(declared.get("name"), str):
                    name = str(declared["name"])
                    how = _as_dict(reached.get(name)) if reached is not None else None
                    known[name] = server_identity(declared, how)
            self._identities[session] = known
        return known.get(server)


def _as_dict(value: Any) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None
