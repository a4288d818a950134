"""Truss: an MCP client-tier harness with one gate for every tool call and a signed, verifiable ledger.

The public API is what ``__all__`` names; everything else may change without notice. It is built
around the verbs of a run, each taking one ``Runtime`` (the store, key, clock, home, environment,
connector and provider a run uses, built once by the caller)::

    import anyio, truss
    from truss.mcp import connect

    with truss.Runtime.open(home=".truss", create=True, connector=connect) as runtime:
        contract = truss.load_contract("contracts/hello.toml", home=runtime.home)
        outcome = anyio.run(truss.run_contract, runtime, contract)
        print(outcome.status, outcome.head)

- ``run_contract``, ``resume_session``, ``replay_session``: run, continue and re-derive sessions
  (``RunOutcome``, ``ReplayReport``); ``approve_call``, ``resolve_call``, ``deliver_signal``:
  what a person or another system records while a run waits.
- The protocols a user implements: ``LedgerStore`` (a store backend), ``ToolTransport`` (how the
  gate reaches a tool), ``Provider`` (a model).
- The error tree (``TrussError`` and its subclasses, drawn in ``truss._errors``).

Verification is ``truss.ledger.verify``. Only the errors and the clock load eagerly: the run
machinery is imported on first use, so ``import truss`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from truss._clock import Clock, SystemClock
from truss._errors import (
    BundleFormatError,
    ContractError,
    InDoubtError,
    InputError,
    KeyFileError,
    LoginRequiredError,
    McpError,
    NotFoundError,
    PinMismatchError,
    PolicyError,
    ProviderError,
    QuotaExceededError,
    ReplayDivergenceError,
    RunSuspended,
    RuntimeFailure,
    SandboxError,
    ServerStartError,
    SessionBusyError,
    StoreBusyError,
    StoreConflictError,
    StoreError,
    ToolCallError,
    ToolNotAdvertisedError,
    TrussError,
    UsageError,
    VerificationError,
    WitnessError,
)

if TYPE_CHECKING:
    from truss.contract import Contract, load_contract
    from truss.durable import ReplayReport, deliver_signal, replay_session, resolve_call
    from truss.ledger.stores.base import LedgerStore
    from truss.providers.base import Provider
    from truss.runtime import Runtime
    from truss.session import RunOutcome, approve_call, resume_session, run_contract
    from truss.tools import ToolTransport

from truss._version import __version__

# Public name -> the module that defines it (loaded by ``__getattr__`` on first use).
_LAZY: dict[str, str] = {
    "Contract": "truss.contract",
    "load_contract": "truss.contract",
    "ReplayReport": "truss.durable",
    "deliver_signal": "truss.durable",
    "replay_session": "truss.durable",
    "resolve_call": "truss.durable",
    "LedgerStore": "truss.ledger.stores.base",
    "Provider": "truss.providers.base",
    "Runtime": "truss.runtime",
    "RunOutcome": "truss.session",
    "approve_call": "truss.session",
    "resume_session": "truss.session",
    "run_contract": "truss.session",
    "ToolTransport": "truss.tools",
}

__all__ = [
    "BundleFormatError",
    "Clock",
    "Contract",
    "ContractError",
    "InDoubtError",
    "InputError",
    "KeyFileError",
    "LedgerStore",
    "LoginRequiredError",
    "McpError",
    "NotFoundError",
    "PinMismatchError",
    "PolicyError",
    "Provider",
    "ProviderError",
    "QuotaExceededError",
    "ReplayDivergenceError",
    "ReplayReport",
    "RunOutcome",
    "RunSuspended",
    "Runtime",
    "RuntimeFailure",
    "SandboxError",
    "ServerStartError",
    "SessionBusyError",
    "StoreBusyError",
    "StoreConflictError",
    "StoreError",
    "SystemClock",
    "ToolCallError",
    "ToolNotAdvertisedError",
    "ToolTransport",
    "TrussError",
    "UsageError",
    "VerificationError",
    "WitnessError",
    "__version__",
    "approve_call",
    "deliver_signal",
    "load_contract",
    "replay_session",
    "resolve_call",
    "resume_session",
    "run_contract",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'truss' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
