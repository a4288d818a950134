"""The provider registry: ``agent.provider`` -> a factory that builds the provider from the contract.

A ``ProviderRegistry`` pairs the registry of provider *kinds* the contract loader checks names
against (``truss.contract.PROVIDER_KINDS`` for the default one) with a factory per kind, so that
one ``register(kind, factory)`` makes a name both loadable and buildable. ``PROVIDERS`` is the
default registry, with Truss's ``scripted``, ``anthropic`` and ``openai``; ``copy()`` gives one a
program or a test may extend on its own. ``build`` refuses a name with no kind or no factory
(an ``InputError``): a provider is never replaced by another.

The built-in HTTP factories take API keys only from the environment mapping they are given,
under the name ``agent.api_key_env``; when that is unset, the kind's usual variable
(``ProviderCapabilities.api_key_env``) is read only for the provider's own host: a contract that
sets ``base_url`` gets a key only by naming its variable, so a key is never sent to a host its
owner did not pair it with. The key lives inside the provider's HTTP client and never in a
``TurnRequest``, a ``TurnResponse``, a repr or an error, and it is sent in clear text only to this
machine: a plain ``http://`` base_url on another host with a key is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx2

from truss._clock import Clock
from truss._errors import InputError
from truss._registry import Registry
from truss.contract import PROVIDER_KINDS, AgentConfig, Contract, ProviderKind, duration_ms
from truss.contract.providers import ANTHROPIC, OPENAI, SCRIPTED
from truss.providers._http import HttpSettings, Sleep
from truss.providers.anthropic import AnthropicProvider
from truss.providers.base import Provider
from truss.providers.openai import OpenAIProvider
from truss.providers.scripted import ScriptedProvider

__all__ = ["PROVIDERS", "ProviderEnv", "ProviderFactory", "ProviderRegistry", "http_settings"]


@dataclass(frozen=True)
class ProviderEnv:
    """What a factory may use besides the contract.

    ``environ`` holds API keys (and fills ``${env.X}`` in a plan); ``clock`` is the injected clock;
    ``transport`` (an ``httpx2`` transport), ``sleep`` (default ``anyio.sleep``) and ``jitter``
    (default ``random.random``) let tests answer HTTP and retry waits without a network or a delay.
    """

    environ: Mapping[str, str]
    clock: Clock
    transport: httpx2.AsyncBaseTransport | None = None
    sleep: Sleep | None = None
    jitter: Callable[[], float] | None = None


ProviderFactory = Callable[[Contract, ProviderEnv], Provider]
"""Builds the provider a contract names; raises ``InputError`` for what the contract or environment lacks."""


class ProviderRegistry:
    """Provider kinds (what a contract may name) and their factories (how each is built), by name."""

    def __init__(self, kinds: Registry[ProviderKind] | None = None) -> None:
        self.kinds: Registry[ProviderKind] = kinds if kinds is not None else Registry("provider")
        self._factories: dict[str, ProviderFactory] = {}

    def __repr__(self) -> str:
        return f"ProviderRegistry(names={list(self.kinds.names())!r})"

    def register(self, kind: ProviderKind, factory: ProviderFactory, *, replace: bool = False) -> None:
        """Make ``kind.name`` loadable and buildable. A name already taken raises ``ValueError`` unless ``replace``.

        A kind already in ``kinds`` (the same object) without a factory gets this one: that is how
        Truss's own kinds, declared in ``truss.contract``, get theirs.
        """
        declared = self.kinds.get(kind.name)
        if declared is not kind or kind.name in self._factories:
            self.kinds.register(kind, replace=replace)
        self._factories[kind.name] = factory

    def unregister(self, name: str) -> None:
        self.kinds.unregister(name)
        self._factories.pop(name, None)

    @contextmanager
    def registered(self, kind: ProviderKind, factory: ProviderFactory) -> Generator[ProviderKind]:
        """``kind`` is registered with ``factory`` inside the block and removed after it."""
        self.register(kind, factory)
        try:
            yield kind
        finally:
            if self.kinds.get(kind.name) is kind:
                self.unregister(kind.name)

    def factory(self, name: str) -> ProviderFactory | None:
        return self._factories.get(name) if name in self.kinds else None

    def copy(self) -> ProviderRegistry:
        """An independent registry with the same kinds and factories."""
        other = ProviderRegistry(self.kinds.copy())
        other._factories = dict(self._factories)
        return other

    def build(self, contract: Contract, env: ProviderEnv) -> Provider:
        """The provider ``contract.agent.provider`` names, built by its factory."""
        name = contract.agent.provider
        factory = self.factory(name)
        if factory is None:
            why = self.kinds.unknown(name) if name not in self.kinds else f"provider {name!r} has no factory"
            raise InputError(
                why,
                remedy="Name a registered provider in agent.provider (docs/providers.md), or register it with "
                "truss.providers.PROVIDERS.register(kind, factory) before the run",
                provider=name,
            )
        return factory(contract, env)


def http_settings(agent: AgentConfig) -> HttpSettings:
    """Timeouts and attempts from ``[agent]``; the other bounds keep their defaults."""
    return HttpSettings(request_timeout_s=duration_ms(agent.request_timeout) / 1000.0, max_attempts=agent.max_attempts)


def _scripted(contract: Contract, env: ProviderEnv) -> Provider:
    return ScriptedProvider(contract, environ=env.environ)


def _over_http(kind: ProviderKind, provider: type[AnthropicProvider | OpenAIProvider]) -> ProviderFactory:
    """The factory of a provider behind a model API: it needs a model, and an API key unless its server needs none."""

    def build(contract: Contract, env: ProviderEnv) -> Provider:
        agent = contract.agent
        model, api_key = _model_and_key(agent, kind, env.environ)
        return provider(
            model=model,
            api_key=api_key,
            base_url=agent.base_url,
            max_output_tokens=agent.max_output_tokens,
            temperature=agent.temperature,
            settings=http_settings(agent),
            clock=env.clock,
            sleep=env.sleep,
            jitter=env.jitter,
            transport=env.transport,
        )

    return build


def _model_and_key(agent: AgentConfig, kind: ProviderKind, environ: Mapping[str, str]) -> tuple[str, str | None]:
    model = agent.model
    if not model:  # the contract model refuses this; checked again because the key lookup relies on it
        raise InputError(f"provider {kind.name!r} needs a model", remedy="Set agent.model", provider=kind.name)
    api_key = _api_key(agent, kind, environ)
    if api_key is not None and agent.base_url is not None and not _key_may_travel_to(agent.base_url):
        raise InputError(
            f"agent.base_url {_host_of(agent.base_url)!r} is plain http on a host other than this machine:"
            f" the API key in {agent.api_key_env} would cross the network unencrypted",
            remedy="Use an https:// base_url, or drop agent.api_key_env for a server that needs no key",
            provider=kind.name,
            env=agent.api_key_env,
        )
    return model, api_key


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


def _api_key(agent: AgentConfig, kind: ProviderKind, environ: Mapping[str, str]) -> str | None:
    name = agent.api_key_env
    if name is None:
        if agent.base_url is not None or kind.capabilities.api_key_env is None:
            return None
        name = kind.capabilities.api_key_env
    value = environ.get(name)
    if not value:
        raise InputError(
            f"provider {kind.name!r} needs an API key in the environment variable {name}, which is not set",
            remedy=(
                f"Export {name}, or set agent.api_key_env to the variable that holds the key"
                + (
                    "; a server that needs no key (Ollama, llama.cpp) needs no agent.api_key_env"
                    if agent.api_key_env
                    else ""
                )
            ),
            provider=kind.name,
            env=name,
        )
    if not value.isascii() or not value.isprintable() or any(ch.isspace() for ch in value):
        # Checked here because httpx2 would otherwise fail later with the value in its message.
        raise InputError(
            f"the environment variable {name} does not hold a usable API key: it must be printable ASCII"
            " without spaces or line breaks",
            remedy=f"Check the value of {name} (a stray newline from a file is the usual cause)",
            provider=kind.name,
            env=name,
        )
    return value


PROVIDERS = ProviderRegistry(PROVIDER_KINDS)
"""The default registry: Truss's providers, by the kinds ``truss.contract.PROVIDER_KINDS`` declares."""
PROVIDERS.register(SCRIPTED, _scripted)
PROVIDERS.register(ANTHROPIC, _over_http(ANTHROPIC, AnthropicProvider))
PROVIDERS.register(OPENAI, _over_http(OPENAI, OpenAIProvider))
