"""Provider kinds: the names ``[agent] provider`` may take, and what each kind can do.

A contract names its model provider; the name is looked up in a registry of ``ProviderKind`` at
load, and a name that is not registered is refused with its key path (never treated as another
provider). Truss registers ``scripted``, ``anthropic`` and ``openai``; a program or a test
registers more with ``truss.providers.PROVIDERS.register(kind, factory)``, which adds the kind
here and its factory in ``truss.providers`` in one step. This module holds what the contract
needs to know about a kind (its name and its ``ProviderCapabilities``), not how to build one:
building is ``truss.providers``'s, which imports the contract and so cannot be imported here.

The capabilities are what the rest of Truss asks instead of comparing names: the loader whether
``agent.model`` is required, the loop whether a recorded turn may be checked by asking again
(a provider that plays a fixed plan), the HTTP providers which environment variable holds their
API key by default. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from truss._registry import Registry

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "PROVIDER_KINDS",
    "SCRIPTED",
    "ProviderCapabilities",
    "ProviderKind",
    "provider_kinds_in",
]


@dataclass(frozen=True)
class ProviderCapabilities:
    """What a provider can do, as the loader, the loop and the factories ask it.

    ``plays_plan``: its answer is a pure function of the contract and the request (it plays
    ``[[agent.steps]]``), so asking it again costs nothing and calls nothing; on resume the loop
    asks it for every recorded turn and stops with a divergence when the answer changed (the plan
    was edited). A model is never asked again. ``reads_new_messages``: it reads only the messages
    added since the request it answered last (``TurnRequest.first`` says where they start); with
    ``plays_plan`` it is asked every turn, live or replayed, so the loop sends it only those and keeps
    no conversation; any other provider gets the whole conversation every turn. ``needs_model``: the contract must set
    ``agent.model``. ``api_key_env``: the environment variable that holds its API key when the
    contract names none (read only for the provider's own host); None when it needs no key.
    """

    plays_plan: bool = False
    reads_new_messages: bool = False
    needs_model: bool = True
    api_key_env: str | None = None


@dataclass(frozen=True)
class ProviderKind:
    """A provider a contract may name: ``name`` (``agent.provider``), its capabilities, one line about it."""

    name: str
    capabilities: ProviderCapabilities
    summary: str = ""


SCRIPTED = ProviderKind(
    "scripted",
    ProviderCapabilities(plays_plan=True, reads_new_messages=True, needs_model=False),
    "plays [[agent.steps]] offline",
)
ANTHROPIC = ProviderKind(
    "anthropic", ProviderCapabilities(api_key_env="ANTHROPIC_API_KEY"), "the Anthropic Messages API"
)
OPENAI = ProviderKind(
    "openai", ProviderCapabilities(api_key_env="OPENAI_API_KEY"), "OpenAI Chat Completions and compatible servers"
)

PROVIDER_KINDS: Registry[ProviderKind] = Registry("provider", [SCRIPTED, ANTHROPIC, OPENAI])
"""The provider kinds contracts are loaded against unless the loader is given another registry."""

CONTEXT_KEY = "truss.provider_kinds"
"""The key of a provider-kind registry in a pydantic validation context (``Contract.model_validate``)."""


def provider_kinds_in(context: object) -> Registry[ProviderKind]:
    """The registry a validation ``context`` carries, or ``PROVIDER_KINDS``."""
    if isinstance(context, Mapping):
        found = cast(Mapping[str, Any], context).get(CONTEXT_KEY)
        if isinstance(found, Registry):
            return cast(Registry[ProviderKind], found)
    return PROVIDER_KINDS
