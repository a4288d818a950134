"""OAuth 2.1 as an auth flow of the HTTP connector: the MCP SDK's providers, Truss's store and rules.

``OAuthFlows`` is an ``HttpAuth`` (``truss.mcp.auth``): a server without ``[mcp.servers.oauth]``
gets the contract's static headers as before; one with it gets one of the SDK's providers
(``mcp.client.auth``: ``OAuthClientProvider`` for the authorization code grant with PKCE,
``ClientCredentialsOAuthProvider``, ``PrivateKeyJWTOAuthProvider``), subclassed only to:

- keep tokens in the ``TokenStore`` keyed by (issuer, resource), with their absolute expiry, so a
  token stored by an earlier run is refreshed before the first call when it has expired or is
  about to (``REFRESH_MARGIN_S``), on ``resume`` as on a first run;
- register every token, client secret and assertion with the redactor the moment it is seen;
- never wait for a person unless the caller is ``truss mcp login`` (``Interactive``): headless, a
  grant that needs a person (no stored token, a refresh the server refused, a scope step-up of the
  authorization code grant) stops with ``LoginRequiredError`` (exit 5) naming ``truss mcp login``;
- bound scope step-ups (``max_step_ups`` per connection) and report each, and each refresh, as a
  server event;
- map the SDK's OAuth errors to Truss errors whose text is scrubbed of every known secret (the
  SDK quotes the authorization server's response body and the state value in some).

``describe(server)`` gives what ``session_started`` records as the server's ``auth``: the grant,
and under ``identity`` the issuer and the client id (the memo keys on ``identity``: one account's
memoized result never answers another's), plus the granted scopes and the expiry once known.
Never a token, never a hash of one.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.utils import extract_field_from_www_auth, union_scopes
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
)
from mcp.shared.auth_utils import calculate_token_expiry, resource_url_from_server_url
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER

from truss._clock import Clock
from truss._errors import InputError, LoginRequiredError, ServerStartError, TrussError
from truss.contract import OAuth, Server
from truss.mcp.launch import Report
from truss.mcp.oauth.store import Grant, TokenStore, remember_all
from truss.redaction import remember_secret, scrub_secrets

__all__ = ["REFRESH_MARGIN_S", "Interactive", "OAuthFlows", "resource_of"]

REFRESH_MARGIN_S = 30.0
"""A stored token expiring within this many seconds is refreshed before it is used."""


def resource_of(server: Server) -> str:
    """The server's resource URI (RFC 8707: its canonical URL), the store's key with the issuer."""
    assert server.url is not None
    return resource_url_from_server_url(server.url)


@dataclass
class Interactive:
    """What ``truss mcp login`` gives the flow so that a person can authorize: the redirect URI it
    listens on, what to do with the authorization URL, and how to wait for the redirect."""

    redirect_uri: str
    show: Callable[[str], Awaitable[None]]
    wait: Callable[[], Awaitable[AuthorizationCodeResult]]


def _login_needed(server: Server, cause: str, issuer: str | None, why: str) -> LoginRequiredError:
    return LoginRequiredError(
        f"MCP server {server.name!r} needs an OAuth login: {why}, and this command never waits for a person; "
        f"run `truss mcp login {server.name}` first",
        remedy=f"Run `truss mcp login {server.name} --contract FILE` once (a browser, or paste the redirect), "
        "then run again",
        server=server.name,
        issuer=issuer,
        cause=cause,
    )


class _Storage:
    """The SDK's ``TokenStorage`` over Truss's ``TokenStore``, for one server."""

    def __init__(
        self, flows: OAuthFlows, server: Server, oauth: OAuth, preset: OAuthClientInformationFull | None
    ) -> None:
        self.flows, self.server, self.oauth, self.preset = flows, server, oauth, preset
        self.resource = resource_of(server)
        self.grant: Grant | None = flows.store.find(self.resource, oauth.issuer, oauth.client_id)
        self.client: OAuthClientInformationFull | None = None
        self.provider: OAuthClientProvider | None = None

    def remaining_s(self) -> float | None:
        if self.grant is None or self.grant.expires_at_ms is None:
            return None
        return (self.grant.expires_at_ms - self.flows.clock.now_ms()) / 1000.0

    async def get_tokens(self) -> OAuthToken | None:
        if self.grant is None or not self.grant.tokens.get("access_token"):
            return None
        return OAuthToken.model_validate(self.grant.tokens)

    async def set_tokens(self, tokens: OAuthToken) -> None:
        dumped = tokens.model_dump(mode="json", exclude_none=True)
        remember_all(dumped)
        now = self.flows.clock.now_ms()
        expires = None if tokens.expires_in is None else now + int(float(tokens.expires_in) * 1000)
        client = self.client or self.preset
        old = self.grant
        self.grant = Grant(
            issuer=self._issuer() or (old.issuer if old else "") or "",
            resource=self.resource,
            server=self.server.name,
            grant=self.oauth.grant,
            client_id=client.client_id if client else (old.client_id if old else self.oauth.client_id),
            scopes=(tokens.scope or "").split(),
            expires_at_ms=expires,
            obtained_at_ms=now,
            tokens=dumped,
            client=client.model_dump(mode="json", exclude_none=True) if client else (old.client if old else {}),
            metadata=self._metadata() or (old.metadata if old else {}),
        )
        if self.oauth.grant == "authorization_code" or self.flows.cache_headless:
            self.flows.store.save(self.grant)
        self.flows.noted(self.server, self.grant)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.preset is not None:
            return self.preset
        if self.grant is not None and self.grant.client.get("client_id"):
            self.client = OAuthClientInformationFull.model_validate(self.grant.client)
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        remember_all(client_info.model_dump(mode="json"))
        self.client = client_info

    def _metadata(self) -> dict[str, Any]:
        provider = self.provider
        if provider is None or provider.context.oauth_metadata is None:
            return {}
        return provider.context.oauth_metadata.model_dump(mode="json", exclude_none=True)

    def issuer(self) -> str | None:
        return self._issuer()

    def _issuer(self) -> str | None:
        provider = self.provider
        if provider is None:
            return self.oauth.issuer
        metadata = provider.context.oauth_metadata
        if metadata is not None:
            return str(metadata.issuer)
        return provider.context.auth_server_url or self.oauth.issuer


class _Hooks:
    """What Truss adds to each SDK provider (a mixin over ``OAuthClientProvider``'s subclasses)."""

    context: Any
    _truss: _Wiring
    _initialized: bool  # the SDK's: the stored tokens and client are loaded
    failure: TrussError | None = None
    """The last error this flow raised: the connector reports it instead of the closed connection."""

    async def _initialize(self) -> None:
        await super()._initialize()  # type: ignore[misc]
        grant = self._truss.storage.grant
        if grant is not None and grant.metadata and self.context.oauth_metadata is None:
            # The SDK keeps discovered metadata in memory only; without it, a refresh in a new
            # process would go to the MCP server's origin instead of the authorization server.
            self.context.oauth_metadata = OAuthMetadata.model_validate(grant.metadata)
            self.context.auth_server_url = self.context.auth_server_url or grant.issuer
        remaining = self._truss.storage.remaining_s()
        if remaining is not None and self.context.current_tokens is not None:
            # The SDK forgets a stored token's expiry; without it, an expired token would be sent.
            self.context.token_expiry_time = calculate_token_expiry(max(0, int(remaining - REFRESH_MARGIN_S)))

    async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
        ok = bool(await super()._handle_refresh_response(response))  # type: ignore[misc]  # pyright: ignore[reportUnknownMemberType]
        wiring = self._truss
        wiring.report("oauth_token_refreshed" if ok else "oauth_refresh_refused", {"status": response.status_code})
        if not ok:
            wiring.refresh_failed = True
        return ok

    async def _perform_authorization(self) -> httpx2.Request:
        wiring = self._truss
        if wiring.step_up:
            wiring.step_up = False
            wiring.step_ups += 1
            if wiring.step_ups > wiring.oauth.max_step_ups:
                raise ServerStartError(
                    f"MCP server {wiring.server.name!r} asked for more OAuth scopes {wiring.step_ups} times; "
                    f"Truss stops after max_step_ups = {wiring.oauth.max_step_ups}",
                    remedy="Check the scopes the server requires, or raise max_step_ups in [mcp.servers.oauth]",
                    server=wiring.server.name,
                    cause="step_up_limit",
                )
            wiring.report("oauth_step_up", {"scopes": (self.context.client_metadata.scope or "").split()})
            if wiring.interactive is None and wiring.oauth.grant == "authorization_code":
                wiring.flows.want_scopes(wiring.storage, self.context.client_metadata.scope)
                raise _login_needed(wiring.server, "step_up", wiring.storage.issuer(), "it asks for more scopes")
        if wiring.oauth.scopes:  # the contract's scopes, besides what the server's challenge asks for
            self.context.client_metadata.scope = union_scopes(
                self.context.client_metadata.scope, " ".join(wiring.oauth.scopes)
            )
        if wiring.interactive is None and wiring.oauth.grant == "authorization_code":
            tokens = self.context.current_tokens
            if not wiring.refresh_tried and tokens is not None and tokens.refresh_token and self.context.client_info:
                # The server refused the access token (revoked, or expired early): refresh, once.
                wiring.refresh_tried = True
                return await self._refresh_token()  # type: ignore[misc]
            cause = "refresh_failed" if wiring.refresh_failed else "no_credentials"
            why = (
                "the authorization server refused to refresh the stored token"
                if wiring.refresh_failed
                else "no stored token is usable"
            )
            raise _login_needed(wiring.server, cause, wiring.storage.issuer(), why)
        return await super()._perform_authorization()  # type: ignore[misc]

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """Each request of the connection: the token held in memory, unless something must happen.

        The token lives in the provider (``context.current_tokens``) from the connect on; the
        store is read at the connect and written when a token changes, never per request. While
        the token is valid and no other request is refreshing or authorizing (the SDK's lock is
        free), a request only gets its header: no lock, no extra generator layers, no turn of the
        event loop. Any 401 or 403 is handed to the SDK's flow as if it had sent the request
        itself (it re-authorizes, steps up or refreshes, and retries), as is every request that
        finds the token expired or the lock taken.
        """
        context = self.context
        refusal: httpx2.Response | None = None
        if self._initialized and context.is_token_valid() and not context.lock.locked():
            context.protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
            self._add_auth_header(request)  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue,reportUnknownMemberType]
            response = yield request
            if response.status_code not in (401, 403):
                return
            refusal = response
        flow = cast(AsyncGenerator[httpx2.Request, httpx2.Response], super().async_auth_flow(request))  # type: ignore[misc]  # pyright: ignore[reportUnknownMemberType]
        try:
            outgoing = await flow.__anext__()
            if refusal is not None and outgoing is request:
                # The SDK's flow would send the request as it is now: give it the refusal already
                # received. (When it first asks for something else, a refresh because the token
                # expired meanwhile, the request is sent again when it asks, with the new token.)
                outgoing = await flow.asend(refusal)
            while True:
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()

    async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        wiring = self._truss
        inner = cast(AsyncGenerator[httpx2.Request, httpx2.Response], super()._auth_flow(request))  # type: ignore[misc]  # pyright: ignore[reportUnknownMemberType]
        try:
            outgoing: httpx2.Request = await inner.__anext__()
            while True:
                response = yield outgoing
                if outgoing is request and response.status_code == 403:
                    wiring.step_up = extract_field_from_www_auth(response, "error") == "insufficient_scope"
                outgoing = await inner.asend(response)
        except StopAsyncIteration:
            return
        except TrussError as exc:
            self.failure = exc  # the transport reports only a closed connection; the connector asks for this
            raise
        except Exception as exc:
            if wiring.refresh_tried and wiring.interactive is None:
                why = "the authorization server refused to refresh the stored token"
                self.failure = _login_needed(wiring.server, "refresh_failed", wiring.storage.issuer(), why)
                raise self.failure from None
            self.failure = ServerStartError(
                f"OAuth with MCP server {wiring.server.name!r} failed: {scrub_secrets(str(exc))[:500]}",
                remedy="Check [mcp.servers.oauth] (issuer, client id, grant), or log in again with `truss mcp login`",
                server=wiring.server.name,
                cause="oauth",
            )
            raise self.failure from None


class _AuthCode(_Hooks, OAuthClientProvider):
    pass


class _ClientCredentials(_Hooks, ClientCredentialsOAuthProvider):
    pass


class _PrivateKeyJWT(_Hooks, PrivateKeyJWTOAuthProvider):
    pass


@dataclass
class _Wiring:
    flows: OAuthFlows
    server: Server
    oauth: OAuth
    storage: _Storage
    report: Report
    interactive: Interactive | None
    step_up: bool = False
    step_ups: int = 0
    refresh_failed: bool = False
    refresh_tried: bool = False


class OAuthFlows:
    """The ``HttpAuth`` of ``truss run``, ``truss mcp`` and serve-mcp (see the module docstring).

    ``interactive`` only from ``truss mcp login``. ``cache_headless``: store the tokens of the
    client credentials grants too (so a run reuses a valid one instead of asking again).
    """

    def __init__(
        self,
        store: TokenStore,
        clock: Clock,
        *,
        environ: Mapping[str, str] | None = None,
        interactive: Interactive | None = None,
        cache_headless: bool = True,
    ) -> None:
        self.store, self.clock, self.interactive, self.cache_headless = store, clock, interactive, cache_headless
        self.environ = os.environ if environ is None else environ
        self._described: dict[str, dict[str, Any]] = {}

    @classmethod
    def for_home(cls, home: Path, clock: Clock, **kwargs: Any) -> OAuthFlows:
        return cls(TokenStore(home / "oauth"), clock, **kwargs)

    # -- HttpAuth ----------------------------------------------------------------------------------

    def describe(self, server: Server) -> dict[str, Any]:
        oauth = server.oauth
        if oauth is None:
            return {"kind": "static_headers", "headers": sorted(server.headers)}
        grant = self.store.find(resource_of(server), oauth.issuer, oauth.client_id)
        described: dict[str, Any] = {
            "kind": "oauth",
            "grant": oauth.grant,
            "identity": {
                "issuer": oauth.issuer or (grant.issuer if grant else None),
                "client_id": oauth.client_id or oauth.client_metadata_url or (grant.client_id if grant else None),
            },
            "headers": sorted(server.headers),
        }
        if grant is not None:
            described["scopes"] = list(grant.scopes)
            described["expires_at_ms"] = grant.expires_at_ms
        self._described[server.name] = described
        return described

    def flow(self, server: Server, report: Report) -> httpx2.Auth | None:
        oauth = server.oauth
        if oauth is None:
            return None
        assert server.url is not None
        preset: OAuthClientInformationFull | None = None
        secret: str | None = None
        if oauth.client_secret_env is not None:
            secret = self.environ.get(oauth.client_secret_env)
            if not secret:
                raise ServerStartError(
                    f"MCP server {server.name!r} needs the OAuth client secret from the variable "
                    f"{oauth.client_secret_env}, which is not set",
                    remedy=f"Set {oauth.client_secret_env} in Truss's environment",
                    server=server.name,
                    cause="missing_secret",
                )
            remember_secret(secret)
        scope = " ".join(oauth.scopes) or None
        redirect = self.interactive.redirect_uri if self.interactive is not None else "http://127.0.0.1/callback"
        if oauth.grant == "authorization_code" and oauth.client_id is not None:
            preset = OAuthClientInformationFull(
                client_id=oauth.client_id,
                client_secret=secret,
                redirect_uris=[cast(Any, redirect)],
                token_endpoint_auth_method=oauth.token_endpoint_auth if secret else "none",
                grant_types=["authorization_code", "refresh_token"],
            )
        storage = _Storage(self, server, oauth, preset)
        stored = storage.grant is not None and bool(storage.grant.tokens.get("access_token"))
        if oauth.grant == "authorization_code" and self.interactive is None and not stored:
            raise _login_needed(server, "no_credentials", oauth.issuer, "no token is stored for it")
        wiring = _Wiring(self, server, oauth, storage, report, self.interactive)
        provider: OAuthClientProvider
        with warnings.catch_warnings():  # the SDK warns when no issuer is given; docs/oauth.md says so
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            provider = self._provider(server, oauth, storage, scope=scope, secret=secret, redirect=redirect)
        cast(Any, provider)._truss = wiring
        storage.provider = provider
        return provider

    def _provider(
        self, server: Server, oauth: OAuth, storage: _Storage, *, scope: str | None, secret: str | None, redirect: str
    ) -> OAuthClientProvider:
        assert server.url is not None
        provider: OAuthClientProvider
        if oauth.grant == "client_credentials":
            assert oauth.client_id is not None and secret is not None
            provider = _ClientCredentials(
                server.url, storage, oauth.client_id, secret,
                token_endpoint_auth_method=oauth.token_endpoint_auth, scope=scope, issuer=oauth.issuer,
            )  # fmt: skip
        elif oauth.grant == "private_key_jwt":
            assert oauth.client_id is not None and oauth.private_key_file is not None
            provider = _PrivateKeyJWT(
                server.url, storage, oauth.client_id, self._assertions(server, oauth), scope=scope, issuer=oauth.issuer
            )
        else:
            metadata = OAuthClientMetadata(
                redirect_uris=[cast(Any, redirect)],
                client_name="Truss",
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="none",  # noqa: S106 - a public client, no secret
                scope=scope,
            )
            interactive = self.interactive
            provider = _AuthCode(
                server.url,
                metadata,
                storage,
                redirect_handler=interactive.show if interactive is not None else _never,
                callback_handler=interactive.wait if interactive is not None else _never_result,
                client_metadata_url=oauth.client_metadata_url,
            )
        return provider

    # -- helpers -------------------------------------------------------------------------------------

    def _assertions(self, server: Server, oauth: OAuth) -> Callable[[str], Awaitable[str]]:
        assert oauth.private_key_file is not None and oauth.client_id is not None
        path = Path(oauth.private_key_file).expanduser()
        try:
            key = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"the private_key_jwt key file {path} of MCP server {server.name!r} cannot be read "
                f"({type(exc).__name__})",
                remedy="Point private_key_file at a PEM private key Truss can read",
            ) from None
        remember_secret(key.strip())
        sign = SignedJWTParameters(
            issuer=oauth.client_id, subject=oauth.client_id, signing_key=key, signing_algorithm=oauth.key_algorithm
        ).create_assertion_provider()

        async def assertion(audience: str) -> str:
            signed = await sign(audience)
            remember_secret(signed)
            return signed

        return assertion

    def noted(self, server: Server, grant: Grant) -> None:
        """A new token arrived: the recorded description gains the non-secret facts."""
        described = self._described.get(server.name)
        if described is not None:
            identity: dict[str, Any] = described["identity"]
            identity["issuer"] = identity.get("issuer") or grant.issuer or None
            identity["client_id"] = identity.get("client_id") or grant.client_id
            described["scopes"] = list(grant.scopes)
            described["expires_at_ms"] = grant.expires_at_ms

    def want_scopes(self, storage: _Storage, scope: str | None) -> None:
        """A headless step-up: remember the scopes the server asked for, for the next ``truss mcp login``."""
        grant = storage.grant
        if grant is not None and scope:
            grant.wanted_scopes = scope.split()
            self.store.save(grant)


async def _never(url: str) -> None:
    raise AssertionError("unreachable: a headless flow never redirects")  # _perform_authorization stops first


async def _never_result() -> AuthorizationCodeResult:
    raise AssertionError("unreachable: a headless flow never waits for a redirect")
