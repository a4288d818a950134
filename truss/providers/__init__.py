"""Model providers: scripted (offline default), anthropic, openai (chat-completions compatible).

``make_provider`` builds the one the contract's ``[agent]`` table names. API keys come only from
the environment mapping it is given, under the name ``agent.api_key_env``; when that is unset, the
provider's usual variable (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``) is read only for the
provider's own host: a contract that sets ``base_url`` gets a key only by naming its variable, so
a key is never sent to a host its owner did not pair it with. The key lives inside the provider's
HTTP client and never in a ``TurnRequest``, a ``TurnResponse``, a repr or an error, and it is
sent in clear text only to this machine: a plain ``http://`` base_url on another host with a key
is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping

import httpx2

from truss._clock import Clock
from truss._errors import InputError
from truss.contract import AgentConfig, Contract, duration_ms
from truss.providers._http import HttpSettings, Sleep, retry_after_s
from truss.providers.anthropic import AnthropicProvider
from truss.providers.base import Provider, StopReason, ToolCall, ToolSpec, TurnRequest, TurnResponse, Usage
from truss.providers.openai import OpenAIProvider
from truss.providers.scripted import ScriptedProvider, resolve_pointer

__all__ = [
    "AnthropicProvider",
    "HttpSettings",
    "OpenAIProvider",
    "Provider",
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

_DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def make_provider(
    contract: Contract,
    *,
    environ: Mapping[str, str],
    clock: Clock,
    transport: httpx2.AsyncBaseTransport | None = None,
    sleep: Sleep | None = None,
    jitter: Callable[[], float] | None = None,
) -> Provider:
    """The provider ``contract.agent`` describes.

    ``sleep`` (default ``anyio.sleep``) and ``jitter`` (default ``random.random``) are the waits
    and randomness between retries; tests pass ones that record and return at once. Raises
    ``InputError`` when a needed API key is not in ``environ``, or when a scripted step refers
    to a parameter without a value or an environment variable that is not set.
    """
    agent = contract.agent
    if agent.provider == "scripted":
        return ScriptedProvider(contract, environ=environ)
    model = agent.model
    if not model:  # the contract model refuses this; checked again because the key lookup relies on it
        raise InputError(
            f"provider {agent.provider!r} needs a model", remedy="Set agent.model", provider=agent.provider
        )
    api_key = _api_key(agent, environ)
    if api_key is not None and agent.base_url is not None and not _key_may_travel_to(agent.base_url):
        raise InputError(
            f"agent.base_url {_host_of(agent.base_url)!r} is plain http on a host other than this machine:"
            f" the API key in {agent.api_key_env} would cross the network unencrypted",
            remedy="Use an https:// base_url, or drop agent.api_key_env for a server that needs no key",
            provider=agent.provider,
            env=agent.api_key_env,
        )
    kind = AnthropicProvider if agent.provider == "anthropic" else OpenAIProvider
    return kind(
        model=model,
        api_key=api_key,
        base_url=agent.base_url,
        max_output_tokens=agent.max_output_tokens,
        temperature=agent.temperature,
        settings=http_settings(agent),
        clock=clock,
        sleep=sleep,
        jitter=jitter,
        transport=transport,
    )


def http_settings(agent: AgentConfig) -> HttpSettings:
    """Timeouts and attempts from ``[agent]``; the other bounds keep their defaults."""
    return HttpSettings(request_timeout_s=duration_ms(agent.request_timeout) / 1000.0, max_attempts=agent.max_attempts)


def _host_of(url: str) -> str:
    try:
        return httpx2.URL(url).host
    except httpx2.InvalidURL:
        return "<invalid URL>"


def _key_may_travel_to(url: str) -> bool:
    """True for https, and for plain http only to this machine (a local Ollama or vLLM)."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return False
    if parsed.scheme == "https":
        return True
    host = parsed.host.lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api_key(agent: AgentConfig, environ: Mapping[str, str]) -> str | None:
    name = agent.api_key_env
    if name is None:
        if agent.base_url is not None:
            return None
        name = _DEFAULT_KEY_ENV[agent.provider]
    value = environ.get(name)
    if not value:
        raise InputError(
            f"provider {agent.provider!r} needs an API key in the environment variable {name}, which is not set",
            remedy=(
                f"Export {name}, or set agent.api_key_env to the variable that holds the key"
                + (
                    "; a server that needs no key (Ollama, llama.cpp) needs no agent.api_key_env"
                    if agent.api_key_env
                    else ""
                )
            ),
            provider=agent.provider,
            env=name,
        )
    if not value.isascii() or not value.isprintable() or any(ch.isspace() for ch in value):
        # Checked here because httpx2 would otherwise fail later with the value in its message.
        raise InputError(
            f"the environment variable {name} does not hold a usable API key: it must be printable ASCII"
            " without spaces or line breaks",
            remedy=f"Check the value of {name} (a stray newline from a file is the usual cause)",
            provider=agent.provider,
            env=name,
        )
    return value
