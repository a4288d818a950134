"""Truss: an MCP client-tier harness with one gate for every tool call and a signed, verifiable ledger.

The public API is what ``__all__`` names; everything else may change without notice.
"""

from __future__ import annotations

from truss._clock import Clock, SystemClock
from truss._errors import (
    BundleFormatError,
    ContractError,
    InDoubtError,
    InputError,
    KeyFileError,
    McpError,
    NotFoundError,
    PinMismatchError,
    PolicyError,
    ProviderError,
    ReplayDivergenceError,
    RunSuspended,
    RuntimeFailure,
    SandboxError,
    ServerStartError,
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
from truss.contract import Contract, contract_hash, load_contract, narrow_budget, render_arguments, render_intent

__version__ = "0.1.0"

__all__ = [
    "BundleFormatError",
    "Clock",
    "Contract",
    "ContractError",
    "InDoubtError",
    "InputError",
    "KeyFileError",
    "McpError",
    "NotFoundError",
    "PinMismatchError",
    "PolicyError",
    "ProviderError",
    "ReplayDivergenceError",
    "RunSuspended",
    "RuntimeFailure",
    "SandboxError",
    "ServerStartError",
    "StoreBusyError",
    "StoreConflictError",
    "StoreError",
    "SystemClock",
    "ToolCallError",
    "ToolNotAdvertisedError",
    "TrussError",
    "UsageError",
    "VerificationError",
    "WitnessError",
    "__version__",
    "contract_hash",
    "load_contract",
    "narrow_budget",
    "render_arguments",
    "render_intent",
]
