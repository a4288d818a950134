"""Secrets out of the record: ``secret_args`` fields redacted, known secret values scrubbed.

``Redactor`` replaces each server's ``secret_args`` fields by ``"[redacted]"`` before anything is
hashed or stored, and scrubs every known secret value (secret arguments seen in this run,
``secret_env`` and secret header values) from every string the session stores. Values live only
in the redactor's memory; nothing derived from them, not even a hash, is written anywhere (a hash
of a short secret is a dictionary-attack target).

Secrets that Truss learns while it runs rather than from the environment (OAuth access and
refresh tokens, client secrets, signed assertions: ``truss.mcp.oauth``) are registered with
``remember_secret`` the moment they are seen; every ``Redactor`` of the process scrubs them too,
and ``scrub_secrets`` scrubs them from any text (error messages, progress lines, logs).

What this module does not do: decide what is stored (the gate, the loop and the session do), or
read the environment itself (it is given one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from truss.contract import PROVIDER_KINDS, Contract

__all__ = ["REDACTED", "Redactor", "remember_secret", "scrub_secrets"]

REDACTED = "[redacted]"
_MIN_SCRUB_LEN = 4  # shorter "secrets" would scrub ordinary text; they are too weak to protect anyway


class _Seen:
    """The secrets this process learned at run time (see the module docstring): values only, in memory."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.generation = 0
        self._pattern: re.Pattern[str] | None = None

    def add(self, value: str) -> None:
        if len(value) >= _MIN_SCRUB_LEN and value not in self.values:
            self.values.add(value)
            self.generation += 1
            self._pattern = None

    def pattern(self) -> re.Pattern[str] | None:
        if self._pattern is None and self.values:
            self._pattern = _alternation(self.values)
        return self._pattern


_SEEN = _Seen()


def remember_secret(value: str | None) -> None:
    """Register a secret Truss has just seen (a token, a client secret): from now on it is scrubbed everywhere."""
    if value:
        _SEEN.add(value)


def scrub_secrets(text: str) -> str:
    """``text`` with every secret registered by ``remember_secret`` replaced by ``"[redacted]"``."""
    pattern = _SEEN.pattern()
    return pattern.sub(REDACTED, text) if pattern is not None else text


def _alternation(values: set[str]) -> re.Pattern[str]:
    ordered = sorted(values, key=len, reverse=True)  # longest first: no partial leftovers
    return re.compile("|".join(re.escape(v) for v in ordered))


class Redactor:
    """Redacts ``secret_args`` fields and scrubs known secret values from anything stored.

    The known values are each server's ``secret_env``, secret header and OAuth client-secret
    values, the model providers' API keys (``agent.api_key_env`` and each reviewer's, or their
    kind's usual variable), and the ``secret_args`` values seen in this run. Each value also
    carries the servers it was given to (none, for a provider key): ``foreign_secret`` finds a
    value in a call's arguments that its server was not given, so the gate can refuse to send it.
    """

    def __init__(self, contract: Contract, environ: Mapping[str, str]) -> None:
        self._secret_fields: dict[str, tuple[str, ...]] = {s.name: tuple(s.secret_args) for s in contract.mcp.servers}
        self._values: set[str] = set()
        self._owners: dict[str, set[str]] = {}  # value -> the servers it was given to
        self._labels: dict[str, str] = {}  # value -> what it is, for a refusal (never the value)
        self._configured: set[str] = set()  # values the environment gave (their owners are fixed)
        for server in contract.mcp.servers:
            names = list(server.secret_env)
            names += [h.secret_env for h in server.headers.values() if not isinstance(h, str)]
            if server.oauth is not None and server.oauth.client_secret_env is not None:
                names.append(server.oauth.client_secret_env)
            for name in names:
                value = environ.get(name)
                if value:
                    self._learn(value, server.name, f"the secret in {name}")
        for name in _provider_key_names(contract):
            value = environ.get(name)
            if value:
                self._learn(value, None, f"the model provider's API key ({name})")
        self._pattern: re.Pattern[str] | None = None
        self._generation = -1

    def remember(self, value: str) -> None:
        if len(value) >= _MIN_SCRUB_LEN and value not in self._values:
            self._values.add(value)
            self._pattern = None

    def _learn(self, value: str, server: str | None, label: str, *, configured: bool = True) -> None:
        """Know ``value`` as given to ``server`` (None: to no server). A value seen in a call's
        ``secret_args`` (``configured=False``) never adds an owner to one the config already gave
        out: else a model could send a provider key or another server's token through that field."""
        if len(value) < _MIN_SCRUB_LEN:
            return
        self.remember(value)
        if not configured and value in self._configured:
            return
        if configured:
            self._configured.add(value)
        owners = self._owners.setdefault(value, set())
        if server is not None:
            owners.add(server)
        self._labels.setdefault(value, label)

    def foreign_secret(self, server: str, arguments: Any) -> str | None:
        """What a known secret in ``arguments`` is (``"the secret in GITHUB_TOKEN"``), when ``server``
        was not given it; None when the arguments hold no such value. Never returns the value itself."""
        foreign = [v for v, owners in self._owners.items() if server not in owners]
        if not foreign:
            return None
        for text in _strings(arguments):
            for value in foreign:
                if value in text:
                    return self._labels[value]
        return None

    def redact_arguments(self, server: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A copy with ``secret_args`` fields replaced by ``"[redacted]"``; their values are remembered.

        A field is a top-level argument name, or a JSON pointer (``/auth/token``) into nested objects.
        """
        out: dict[str, Any] = _deep_copy(dict(arguments))
        for spec in self._secret_fields.get(server, ()):
            path = (
                [p.replace("~1", "/").replace("~0", "~") for p in spec[1:].split("/")]
                if spec.startswith("/")
                else [spec]
            )
            holder: dict[str, Any] | None = out
            for part in path[:-1]:
                holder = _as_dict(holder.get(part)) if holder is not None else None
            if holder is not None and path[-1] in holder:
                for text in _strings(holder[path[-1]], keys=False):
                    self._learn(text, server, f"a secret_args value given to server {server!r}", configured=False)
                holder[path[-1]] = REDACTED
        return self.scrub(out)

    def scrub(self, value: Any) -> Any:
        """``value`` with every known secret value inside its strings replaced by ``"[redacted]"``."""
        if self._generation != _SEEN.generation:  # secrets learned at run time (remember_secret) count too
            self._generation = _SEEN.generation
            self._pattern = None
        values = self._values | _SEEN.values
        if not values:
            return value
        if self._pattern is None:
            self._pattern = _alternation(values)
        return _scrub(value, self._pattern)

    def scrub_text(self, text: str, *, ignore_case: bool = False) -> str:
        """``text`` scrubbed; ``ignore_case`` also catches a secret whose case was changed (a host
        name a server asked its sandbox's proxy for is lower-cased before it is recorded)."""
        if ignore_case and self._values:
            pattern = re.compile("|".join(re.escape(v) for v in sorted(self._values, key=len, reverse=True)), re.I)
            return pattern.sub(REDACTED, text)
        scrubbed: Any = self.scrub(text)
        return scrubbed if isinstance(scrubbed, str) else text


def _scrub(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {_scrub(k, pattern): _scrub(v, pattern) for k, v in cast(dict[Any, Any], value).items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, pattern) for v in cast(list[Any], value)]
    return value


def _provider_key_names(contract: Contract) -> list[str]:
    """The environment variables that may hold a model provider's API key in this contract's runs."""
    agents = [(contract.agent.provider, contract.agent.api_key_env)]
    for check in contract.done.checks:
        agents += [(r.provider, r.api_key_env) for r in check.reviewers or ()]
    names: list[str] = []
    for provider, api_key_env in agents:
        kind = PROVIDER_KINDS.get(provider)
        usual = kind.capabilities.api_key_env if kind is not None else None
        names += [n for n in (api_key_env, usual) if n is not None and n not in names]
    return names


def _strings(value: Any, *, keys: bool = True, _depth: int = 0) -> list[str]:
    """Every string inside a JSON value (object keys too, unless ``keys`` is false), to a bounded depth."""
    if isinstance(value, str):
        return [value]
    if _depth > 200:
        return []
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in cast(dict[Any, Any], value).items():
            if keys and isinstance(key, str):
                out.append(key)
            out += _strings(item, keys=keys, _depth=_depth + 1)
    elif isinstance(value, list | tuple):
        for item in cast(list[Any], value):
            out += _strings(item, keys=keys, _depth=_depth + 1)
    return out


def _as_dict(value: Any) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in cast(dict[Any, Any], value).items()}
    if isinstance(value, list | tuple):
        return [_deep_copy(v) for v in cast(list[Any], value)]
    return value
