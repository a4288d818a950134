"""The ``[[mcp.servers]]`` tables: how to reach a server, which of its tools to mount, and their settings.

A server is stdio (a command, its args, cwd and literal env) or http (a URL and headers). Secrets
never appear as values: ``secret_env`` names variables passed from Truss's environment, and a
header whose value is a secret is ``{ secret_env = "VAR", format = "Bearer {}" }``; a literal that
looks like a credential (by its name) is refused, because the effective contract is recorded. Tool
settings, ``retry_in_doubt`` and ``[[mcp.servers.async]]`` may name only allowlisted tools.
``[mcp.servers.elicitation]`` says how a server's elicitation requests are answered
(``truss.elicitation``); ``[mcp.servers.sandbox]`` how a stdio server is confined
(``truss.contract.sandbox``). ``[mcp.servers.oauth]`` says how an http server is reached through OAuth
2.1 (``truss.mcp.oauth``; docs/oauth.md): the grant, and the *names* of its secrets. Pure.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from truss._credentials import credentials_in_args, redact_url, url_credentials
from truss.contract.fields import (
    CREDENTIAL_ENV_RE,
    CREDENTIAL_HEADER_RE,
    PIN_RE,
    SERVER_NAME_RE,
    Duration,
    EnvName,
    KeyValueError,
    Model,
    NonNegativeInt,
    Pointer,
    check_env_name,
)
from truss.contract.sandbox import Sandbox

__all__ = ["AsyncDecl", "AsyncPending", "Elicitation", "McpConfig", "OAuth", "SecretHeader", "Server", "ToolSettings"]


class SecretHeader(Model):
    """A header whose value comes from Truss's environment at connect time, never recorded."""

    secret_env: EnvName
    format: str = "{}"

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError("format must contain exactly one '{}' where the secret goes")
        return value


class ToolSettings(Model):
    name: str = Field(min_length=1, max_length=256)
    budget_calls: NonNegativeInt | None = None
    call_timeout: Duration | None = None
    pin: str | None = None
    memo: Duration | None = None

    @field_validator("pin")
    @classmethod
    def _pin(cls, value: str | None) -> str | None:
        if value is not None and not PIN_RE.match(value):
            raise ValueError(f"pin {value!r} must be 'sha256:' and 64 lower-case hex digits")
        return value


class AsyncPending(Model):
    pointer: Pointer
    equals: Any


class AsyncDecl(Model):
    """The signal pattern: a result matching ``pending`` suspends until ``truss signal``."""

    tool: str = Field(min_length=1)
    pending: AsyncPending
    signal: Pointer


ElicitValue = str | int | float | bool | list[str]
"""A value an elicitation answer may carry (MCP: string, number, boolean, or an array of strings)."""


class Elicitation(Model):
    """``[mcp.servers.elicitation]``: the answer to this server's elicitation requests, decided without a person.

    ``action`` is what Truss answers every form request with; on ``accept`` the content is, per
    requested property, the value given here, else the property's own default, and a request the
    content cannot satisfy is declined (``truss.elicitation.answer``). The contract is recorded, so
    a value under a credential-like name is refused here like a literal ``env`` credential.
    """

    action: Literal["accept", "decline", "cancel"] = "decline"
    content: dict[str, ElicitValue] = Field(default_factory=dict[str, ElicitValue])

    @model_validator(mode="after")
    def _content(self) -> Elicitation:
        if self.content and self.action != "accept":
            raise ValueError(f'elicitation content is only sent with action = "accept" (this one is {self.action!r})')
        for key, value in self.content.items():
            if not key or len(key) > 128 or any(ord(c) < 0x20 for c in key):
                raise ValueError(f"elicitation content key {key!r} is not a property name")
            if value not in ("", []) and CREDENTIAL_ENV_RE.search(key):
                raise ValueError(
                    f"elicitation content {key!r} holds a literal value and its name says it is a credential; "
                    "the contract is recorded, and a form elicitation must not carry secrets"
                )
        return self


OAuthGrant = Literal["authorization_code", "client_credentials", "private_key_jwt"]


class OAuth(Model):
    """``[mcp.servers.oauth]``: OAuth 2.1 for an http server (docs/oauth.md).

    ``grant`` is ``authorization_code`` (PKCE, a person logs in once with ``truss mcp login``),
    ``client_credentials`` (``client_id`` and the secret in the variable ``client_secret_env``) or
    ``private_key_jwt`` (``client_id`` and a signing key in ``private_key_file``; RFC 7523). The
    authorization code grant registers itself dynamically unless ``client_id`` (pre-registered,
    with ``client_secret_env`` for a confidential client) or ``client_metadata_url`` (a client ID
    metadata document) is given. ``issuer`` pins the authorization server: credentials are only
    ever sent to that one. Secrets are names of variables or files, never values.
    """

    grant: OAuthGrant = "authorization_code"
    issuer: str | None = None
    client_id: str | None = Field(default=None, min_length=1, max_length=1024)
    client_metadata_url: str | None = None
    client_secret_env: EnvName | None = None
    token_endpoint_auth: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"  # noqa: S105
    private_key_file: str | None = Field(default=None, min_length=1)
    key_algorithm: Literal["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"] = "RS256"
    scopes: list[str] = Field(default_factory=list[str])
    redirect_port: int | None = Field(default=None, ge=0, le=65535)
    max_step_ups: int = Field(default=2, ge=0, le=10)

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s?#@]+\Z", value):
            raise ValueError(
                f"issuer {redact_url(value)!r} must be the authorization server's http(s) URL, "
                "without query or user info"
            )
        return value

    @field_validator("client_metadata_url")
    @classmethod
    def _metadata_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https://[^\s/?#@]+/[^\s?#]+\Z", value):
            raise ValueError(
                f"client_metadata_url {redact_url(value)!r} must be an https URL with a path "
                "(a client ID metadata document)"
            )
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[str]) -> list[str]:
        for scope in value:
            if not scope or any(c in scope for c in ' "\\') or any(ord(c) < 0x21 or ord(c) > 0x7E for c in scope):
                raise ValueError(
                    f"scope {scope!r} is not an OAuth scope token (printable ASCII, no space, quote or backslash)"
                )
        return value

    @model_validator(mode="after")
    def _grant_fields(self) -> OAuth:
        if self.grant != "authorization_code":
            if not self.client_id:
                raise ValueError(f"the {self.grant} grant needs a client_id")
            if self.client_metadata_url is not None or self.redirect_port is not None:
                raise ValueError("client_metadata_url and redirect_port belong to the authorization_code grant")
        if self.grant == "client_credentials" and self.client_secret_env is None:
            raise ValueError(
                "the client_credentials grant needs client_secret_env (the name of the variable holding the secret)"
            )
        if self.grant == "private_key_jwt":
            if self.private_key_file is None:
                raise ValueError("the private_key_jwt grant needs private_key_file (the PEM signing key's path)")
            if self.client_secret_env is not None:
                raise ValueError("the private_key_jwt grant signs an assertion; it takes no client_secret_env")
        elif self.private_key_file is not None:
            raise ValueError("private_key_file belongs to the private_key_jwt grant")
        if self.client_metadata_url is not None and self.client_id is not None:
            raise ValueError("give client_id or client_metadata_url, not both (the document's URL is the client id)")
        if self.client_secret_env is not None and self.grant == "authorization_code" and self.client_id is None:
            raise ValueError("client_secret_env with the authorization_code grant is for a pre-registered client_id")
        return self


class Server(Model):
    name: str
    transport: Literal["stdio", "http"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list[str])
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict[str, str])
    secret_env: list[EnvName] = Field(default_factory=list[str])
    url: str | None = None
    headers: dict[str, str | SecretHeader] = Field(default_factory=dict[str, str | SecretHeader])
    allow_tools: list[str]
    budget_calls: NonNegativeInt | None = None
    call_timeout: Duration | None = None
    connect_timeout: Duration = "30s"
    secret_args: list[str] = Field(default_factory=list[str])
    retry_in_doubt: list[str] = Field(default_factory=list[str])
    tools: list[ToolSettings] = Field(default_factory=list[ToolSettings])
    async_: list[AsyncDecl] = Field(default_factory=list[AsyncDecl], alias="async")
    elicitation: Elicitation | None = None
    oauth: OAuth | None = None
    sandbox: Sandbox | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SERVER_NAME_RE.match(value):
            raise ValueError(f"server name {value!r} must be 1-32 of [a-z0-9_-], starting with a letter or digit")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, literal in value.items():
            check_env_name(key)
            # The effective contract is recorded in the ledger: a credential written here would be too.
            if literal and CREDENTIAL_ENV_RE.search(key):
                raise ValueError(
                    f"env {key!r} holds a literal value and its name says it is a credential; the contract "
                    f"is recorded, so list {key!r} in secret_env and set it in Truss's environment instead"
                )
        return value

    @field_validator("args")
    @classmethod
    def _args_without_credentials(cls, value: list[str]) -> list[str]:
        # The effective contract is recorded and exported: a password in a command line would be too.
        found = credentials_in_args(value)
        if found:
            first = found[0]
            rewrite = f"write args[{first.index}] as {first.without!r} and " if first.without else ""
            variable = first.env or "VARIABLE"
            read = f" ({first.env} is read by its client library)" if first.env else " the server reads"
            raise KeyValueError(
                f"args[{first.index}] holds a credential ({first.what}); the contract is recorded and exported, "
                "so a credential may not be written in a server's command line",
                remedy=f"Take it out of args: {rewrite}list the environment variable{read} in "
                f'secret_env = ["{variable}"], and set it in Truss\'s environment',
                at=(first.index,),
            )
        return value

    @field_validator("url")
    @classmethod
    def _url_without_credentials(cls, value: str | None) -> str | None:
        # The effective contract is recorded and exported: a credential in the URL would be too.
        if value is None:
            return value
        found = url_credentials(value)
        if found:
            raise ValueError(
                f"url holds a credential ({'; '.join(found)}); the contract is recorded, so send it as a header "
                'from the environment instead: headers = { Authorization = { secret_env = "VARIABLE", '
                'format = "Bearer {}" } }'
            )
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str | SecretHeader]) -> dict[str, str | SecretHeader]:
        for name, header in value.items():
            if isinstance(header, str) and header and CREDENTIAL_HEADER_RE.search(name):
                raise ValueError(
                    f"header {name!r} holds a literal value and carries credentials; the contract is recorded, "
                    f'so write {name} = {{ secret_env = "VARIABLE", format = "Bearer {{}}" }} instead'
                )
        return value

    @field_validator("allow_tools")
    @classmethod
    def _allow_tools(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('allow_tools is empty: list the tools to mount, or ["*"] for all advertised')
        seen: set[str] = set()
        for item in value:
            if not item or item != item.strip() or any(ord(c) < 0x20 for c in item):
                raise ValueError(f"allow_tools entry {item!r} is not a tool name")
            if item in seen:
                raise ValueError(f"allow_tools lists {item!r} twice")
            seen.add(item)
        if "*" in value and len(value) > 1:
            raise ValueError('allow_tools: "*" already means every advertised tool; list it alone')
        return value

    @model_validator(mode="after")
    def _transport_fields(self) -> Server:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"server {self.name!r}: a stdio server needs a command")
            if self.url is not None or self.headers or self.oauth is not None:
                raise ValueError(f"server {self.name!r}: url, headers and oauth belong to http servers")
        else:
            if not self.url or not re.match(r"^https?://[^\s]+\Z", self.url):
                raise ValueError(f"server {self.name!r}: an http server needs a url starting with http:// or https://")
            if self.command is not None or self.args or self.env or self.cwd is not None:
                raise ValueError(f"server {self.name!r}: command, args, env and cwd belong to stdio servers")
            if self.oauth is not None and any(h.lower() == "authorization" for h in self.headers):
                raise ValueError(
                    f"server {self.name!r}: a server with [mcp.servers.oauth] gets its Authorization header from "
                    "OAuth; remove the static Authorization header"
                )
            if self.sandbox is not None:
                raise KeyValueError(
                    f"server {self.name!r}: a sandbox confines a stdio server Truss starts; an http server is "
                    "not a process Truss starts",
                    remedy="Remove the sandbox table; for HTTP servers the operator's [harness] allow_hosts "
                    "says which hosts their URLs may name",
                )
        names = [t.name for t in self.tools]
        seen: set[str] = set()
        for name in names:  # a set, not list.count: a large file must not cost quadratic time
            if name in seen:
                raise ValueError(f"server {self.name!r}: tool settings for {name!r} appear twice")
            seen.add(name)
        if "*" not in self.allow_tools:
            allowed = set(self.allow_tools)
            for label, listed in (
                ("tools", names),
                ("retry_in_doubt", self.retry_in_doubt),
                ("async", [a.tool for a in self.async_]),
            ):
                for index, name in enumerate(listed):
                    if name not in allowed:
                        raise KeyValueError(
                            f"server {self.name!r}: {label} names {name!r}, which is not in allow_tools",
                            remedy=f"Add {name!r} to allow_tools, or remove this entry",
                            at=(label, index),
                        )
        return self

    def tool_settings(self, tool: str) -> ToolSettings | None:
        for settings in self.tools:
            if settings.name == tool:
                return settings
        return None


class McpConfig(Model):
    servers: list[Server] = Field(default_factory=list[Server])

    @field_validator("servers")
    @classmethod
    def _unique(cls, value: list[Server]) -> list[Server]:
        seen: set[str] = set()
        for server in value:
            if server.name in seen:
                raise ValueError(f"server name {server.name!r} is declared twice")
            seen.add(server.name)
        return value

    def server(self, name: str) -> Server | None:
        for server in self.servers:
            if server.name == name:
                return server
        return None
