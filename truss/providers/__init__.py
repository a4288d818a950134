"""Model providers: scripted (offline default), anthropic, openai (chat-completions compatible).

A contract's ``agent.provider`` names a provider kind; ``PROVIDERS`` (``truss.providers.registry``)
maps each kind to the factory that builds it, and ``make_provider`` is a thin wrapper that builds
the one a contract names from the default registry (or the one it is given). How API keys are
found and where they may be sent is written in ``truss.providers.registry``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx2

from truss._clock import Clock
from truss._pointer import resolve_pointer
from truss.contract import Contract, ProviderCapabilities, ProviderKind
from truss.providers._http import HttpSettings, Sleep, retry_after_s
from truss.providers.anthropic import AnthropicProvider
from truss.providers.base import Provider, StopReason, ToolCall, ToolSpec, TurnRequest, TurnResponse, Usage
from truss.providers.openai import OpenAIProvider
from truss.providers.registry import PROVIDERS, ProviderEnv, ProviderFactory, ProviderRegistry, http_settings
from truss.providers.scripted import ScriptedProvider

__all__ = [
    "PROVIDERS",
    "AnthropicProvider",
    "HttpSettings",
    "OpenAIProvider",
    "Provider",
    "ProviderCapabilities",
    "ProviderEnv",
    "ProviderFactory",
    "ProviderKind",
    "ProviderRegistry",
    "ScriptedProvider",
    "Sleep",
    "StopReason",
    "ToolCall",
    "ToolSpec",
    "TurnRequest",
    "TurnResponse",
    "Usage",
    "http_settings",
    "make_provider",
    "resolve_pointer",
    "retry_after_s",
]


def make_provider(
    contract: Contract,
    *,
    environ: Mapping[str, str],
    clock: Clock,
    transport: httpx2.AsyncBaseTransport | None = None,
    sleep: Sleep | None = None,
    jitter: Callable[[], float] | None = None,
    registry: ProviderRegistry | None = None,
) -> Provider:
    """The provider ``contract.agent`` names, built by its factory in ``registry`` (default ``PROVIDERS``).

    ``sleep`` (default ``anyio.sleep``) and ``jitter`` (default ``random.random``) are the waits
    and randomness between retries; tests pass ones that record and return at once. Raises
    ``InputError`` when the provider is not registered, when a needed API key is not in
    ``environ``, or when a scripted step refers to a parameter without a value or an environment
    variable that is not set.
    """
    env = ProviderEnv(environ=environ, clock=clock, transport=transport, sleep=sleep, jitter=jitter)
    return (registry or PROVIDERS).build(contract, env)
