"""Helpers for gate, loop and session tests: a store in a temp dir, a fake connector, contracts from text.

The fake connector yields a ``FakeTransport`` as the mount set, so a whole run (session, loop,
gate, verdict, ledger) is driven in-process with a handler standing in for the MCP servers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from truss.budget import BudgetState
from truss.contract import Contract, ProviderCapabilities, load_contract_text
from truss.gate import Gate, Journal, Redactor
from truss.ledger.entry import Record, StoredEntry
from truss.ledger.keys import IdentityKey
from truss.ledger.stores.sqlite import SqliteStore, open_sqlite
from truss.providers.base import Provider, ToolCall, TurnRequest, TurnResponse
from truss.providers.scripted import ScriptedProvider
from truss.testing import FakeTransport, ManualClock
from truss.tools import MountedTool, ToolResult

Handler = Callable[[MountedTool, Mapping[str, Any]], Awaitable[ToolResult | Mapping[str, Any]]]

SEED = bytes(range(32))


def contract_from(text: str, *, environ: Mapping[str, str] | None = None) -> Contract:
    return load_contract_text(text, source="test.toml", environ=environ)


def new_store(tmp_path: Path, clock: ManualClock | None = None) -> tuple[SqliteStore, IdentityKey]:
    key = IdentityKey.from_seed(SEED, "truss.test/gate")
    store = open_sqlite(tmp_path / "ledger.db", key=key, clock=clock or ManualClock())
    return store, key


def read_runtime(store: Any) -> Any:
    """A runtime for replay, resolve and signal over ``store``: no key to sign with, but the
    verifier of the gate tests' key, so its reads verify (every read does)."""
    from truss.ledger.keys import TrustedKeys
    from truss.runtime import Runtime

    return Runtime(store, trusted_keys=TrustedKeys([IdentityKey.from_seed(SEED, "truss.test/gate").verifier]))


def entries_of(store: SqliteStore, session: str) -> list[StoredEntry]:
    return list(store.read_session(session))


def kinds_of(store: SqliteStore, session: str) -> list[str]:
    return [e.kind for e in store.read_session(session)]


def steps(store: SqliteStore, session: str = "s_test") -> list[StoredEntry]:
    """The entries after ``session_started`` (what the gate recorded)."""
    return list(store.read_session(session, from_seq=1))


def step_kinds(store: SqliteStore, session: str = "s_test") -> list[str]:
    return [e.kind for e in steps(store, session)]


def files_containing(root: Path, needle: bytes) -> list[str]:
    """Every file under ``root`` (database, WAL, logs, anything) whose bytes contain ``needle``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def fake_connector(transport: FakeTransport) -> Callable[..., Any]:
    @asynccontextmanager
    async def connect(contract: Contract, **_: Any) -> AsyncGenerator[FakeTransport]:
        yield transport

    return connect


def scripted(environ: Mapping[str, str] | None = None) -> Callable[[Contract], Provider]:
    """The scripted provider with ``${params}``/``${env}`` rendering, as a provider factory."""
    env = dict(environ or {})

    def make(contract: Contract) -> Provider:
        return ScriptedProvider(contract, environ=env)

    return make


@dataclass
class ListProvider:
    """A provider that plays fixed responses and records the requests it was given."""

    responses: list[TurnResponse]
    requests: list[TurnRequest] = field(default_factory=list[TurnRequest])
    name: str = "list"
    capabilities: ProviderCapabilities = field(default_factory=lambda: ProviderCapabilities(needs_model=False))

    async def next_turn(self, request: TurnRequest) -> TurnResponse:
        self.requests.append(request)
        if len(self.requests) > len(self.responses):
            return TurnResponse(text="done")
        return self.responses[len(self.requests) - 1]

    async def aclose(self) -> None:
        return None


def calls(*specs: tuple[str, dict[str, Any] | None]) -> TurnResponse:
    """One model turn proposing the given (provider name, arguments) calls."""
    return TurnResponse(
        text="",
        tool_calls=[ToolCall(id=f"m{i}", name=name, arguments=args) for i, (name, args) in enumerate(specs)],
        stop_reason="tool_use",
    )


def make_gate(
    contract: Contract,
    store: SqliteStore,
    transport: FakeTransport,
    *,
    session: str = "s_test",
    clock: ManualClock | None = None,
    environ: Mapping[str, str] | None = None,
    recorded: Iterable[StoredEntry] = (),
) -> Gate:
    clock = clock or ManualClock()
    if store.session(session) is None:
        store.append(session, [Record("session_started", {"contract": contract.contract.name})])
    return Gate(
        contract=contract,
        journal=Journal(store, session, recorded=recorded),
        transport=transport,
        tools=transport.tools,
        clock=clock,
        budget=BudgetState.start(clock.now_ms()),
        redactor=Redactor(contract, environ or {}),
    )
