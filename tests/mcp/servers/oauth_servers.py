"""A real OAuth 2.1 authorization server and two OAuth-protected MCP servers, on 127.0.0.1.

The authorization server is the MCP SDK's own (``mcp.server.auth``: metadata, ``/authorize``,
``/token``, ``/register``, ``/revoke``) over an in-memory provider that consents at once for its one
user (a person who always says yes), plus the client credentials grant the SDK's token endpoint
lacks (``client_secret_basic``/``client_secret_post`` for ``cc-client``, ``private_key_jwt`` for
``jwt-client`` against the public key in the file given as ``--jwt-public-key``). The MCP servers
(``A`` and ``B``, SDK ``MCPServer``s with the SDK's bearer middleware and protected resource
metadata) accept only tokens issued for their own resource. Tools: ``echo``, ``whoami`` (the
token's client id and scopes), ``leak`` (returns the bearer token it was sent: a server that
echoes the token), ``expire_tokens`` (every access token stops working: a token that expires
mid-run).

Tokens look like ``canary-at-<hex>`` and ``canary-rt-<hex>`` so tests can look for them.

Test controls on the authorization server (no auth; loopback only): ``POST /admin/expire``
(every access token stops working: the servers answer 401), ``POST /admin/revoke`` (that, and
every refresh token is revoked), ``GET /admin/log`` (the token requests: grant, client,
resource), ``GET /admin/seen`` (every bearer token each MCP server was sent).

Prints ``AS=<url> A=<url> B=<url>`` once all three listen.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import socket
import sys
import threading
from time import time as wall_time  # noqa: TID251 - a test server, not Truss
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SCOPES = ["mcp:read", "mcp:write"]


class Provider:
    def __init__(self, expires_in: int) -> None:
        self.expires_in = expires_in
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.log: list[dict[str, Any]] = []
        self.seen: dict[str, list[str]] = {}  # server name -> every bearer token it was sent

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = "code-" + secrets.token_bytes(16).hex()
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or ["mcp:read"], expires_at=wall_time() + 300,
            client_id=client.client_id or "", code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource,
            subject="user-1",
        )  # fmt: skip
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    def issue(
        self, client_id: str, scopes: list[str], resource: str | None, *, refresh: bool, grant: str
    ) -> OAuthToken:
        self.log.append({"grant": grant, "client_id": client_id, "resource": resource, "scopes": scopes})
        token = "canary-at-" + secrets.token_bytes(16).hex()
        expires = int(wall_time()) + self.expires_in
        self.access[token] = AccessToken(
            token=token, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource, subject="user-1"
        )
        refresh_token = None
        if refresh:
            refresh_token = "canary-rt-" + secrets.token_bytes(16).hex()
            self.refresh[refresh_token] = RefreshToken(
                token=refresh_token, client_id=client_id, scopes=scopes, resource=resource, subject="user-1"
            )
        return OAuthToken(
            access_token=token, token_type="Bearer", expires_in=self.expires_in, scope=" ".join(scopes),
            refresh_token=refresh_token,
        )  # fmt: skip

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(code.code, None)
        return self.issue(code.client_id, code.scopes, code.resource, refresh=True, grant="authorization_code")

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotated
        return self.issue(refresh_token.client_id, scopes or refresh_token.scopes, refresh_token.resource,
                          refresh=True, grant="refresh_token")  # fmt: skip

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < wall_time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    async def exchange_identity_assertion(self, *args: Any, **kwargs: Any) -> OAuthToken:
        raise AssertionError("not offered")


class _Asgi:
    """An ASGI callable Starlette mounts as an app (a plain function would be a request handler)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Verifier:
    """A resource server's check: a live token issued for this resource (RFC 8707)."""

    def __init__(self, provider: Provider, resource: str, name: str) -> None:
        self.provider, self.resource, self.name = provider, resource, name

    async def verify_token(self, token: str) -> AccessToken | None:
        self.provider.seen.setdefault(self.name, []).append(token)
        found = await self.provider.load_access_token(token)
        if found is None or found.resource != self.resource:
            return None
        return found


def listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def authorization_server(provider: Provider, issuer: str, jwt_public_key: str | None) -> Starlette:
    routes = create_auth_routes(
        provider,  # pyright: ignore[reportArgumentType]
        issuer_url=AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES),
        revocation_options=RevocationOptions(enabled=True),
    )
    sdk_token: Any = next(r for r in routes if isinstance(r, Route) and r.path == "/token").app

    async def token(scope: Any, receive: Any, send: Any) -> None:
        """The SDK's token endpoint, and the client credentials grant it lacks."""
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "client_credentials":
            sent = False

            async def replay() -> Any:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await sdk_token(scope, replay, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        response = client_credentials(form, headers.get("authorization", ""))
        await response(scope, receive, send)

    def client_credentials(form: dict[str, str], header: str) -> Response:
        client_id = None
        if form.get("client_assertion_type") == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
            assertion = form.get("client_assertion") or ""
            try:
                claims = jwt.decode(assertion, jwt_public_key or "", algorithms=["RS256", "ES256"],
                                    audience=[issuer, issuer + "/"])  # fmt: skip
            except jwt.PyJWTError as exc:
                return JSONResponse({"error": "invalid_client", "error_description": str(exc)}, status_code=401)
            if claims.get("iss") == claims.get("sub") == "jwt-client":
                client_id = "jwt-client"
        else:
            given_id, given_secret = form.get("client_id"), form.get("client_secret")
            if header.startswith("Basic "):
                given_id, _, given_secret = base64.b64decode(header[6:]).decode().partition(":")
                given_id, given_secret = unquote(given_id), unquote(given_secret)
            if given_id == "cc-client" and given_secret == "cc-secret-value":
                client_id = "cc-client"
        if client_id is None:
            # The body quotes what was sent, as some servers do: the client must not show it.
            sent = form.get("client_secret") or form.get("client_assertion") or ""
            return JSONResponse(
                {"error": "invalid_client", "error_description": f"unknown client ({sent})"}, status_code=401
            )
        scopes = (form.get("scope") or "mcp:read").split()
        issued = provider.issue(client_id, scopes, form.get("resource") or None, refresh=False,
                                grant="client_credentials")  # fmt: skip
        return JSONResponse(issued.model_dump(mode="json", exclude_none=True), headers={"Cache-Control": "no-store"})

    async def expire(request: Request) -> Response:
        for found in provider.access.values():
            found.expires_at = 0
        return JSONResponse({"ok": True})

    async def revoke(request: Request) -> Response:
        provider.access.clear()
        provider.refresh.clear()
        return JSONResponse({"ok": True})

    async def log(request: Request) -> Response:
        return JSONResponse(provider.log)

    async def seen(request: Request) -> Response:
        return JSONResponse(provider.seen)

    routes = [r for r in routes if not (isinstance(r, Route) and r.path == "/token")]
    routes += [
        Route("/token", _Asgi(token), methods=["POST", "OPTIONS"]),
        Route("/admin/expire", expire, methods=["POST"]),
        Route("/admin/revoke", revoke, methods=["POST"]),
        Route("/admin/log", log, methods=["GET"]),
        Route("/admin/seen", seen, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def resource_server(name: str, provider: Provider, issuer: str, url: str) -> Any:
    app = MCPServer(
        f"oauth-{name}",
        token_verifier=Verifier(provider, url, name),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(url),
            required_scopes=["mcp:read"],
            validate_token_resource=False,  # the verifier checks the resource itself
        ),
    )

    @app.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return text

    @app.tool()
    def whoami() -> str:
        """The calling token's client id and scopes."""
        token = get_access_token()
        return f"{token.client_id} {' '.join(token.scopes)}" if token else "nobody"

    @app.tool()
    def leak() -> str:
        """The bearer token this call carried (a server that echoes it)."""
        token = get_access_token()
        return f"your token is {token.token}" if token else "no token"

    @app.tool()
    def expire_tokens() -> str:
        """Every access token stops working now (this call's answer still arrives)."""
        for found in provider.access.values():
            found.expires_at = 0
        return "expired"

    return app.streamable_http_app(stateless_http=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expires-in", type=int, default=3600)
    parser.add_argument("--jwt-public-key")
    args = parser.parse_args()
    public = None
    if args.jwt_public_key:
        with open(args.jwt_public_key, encoding="utf-8") as handle:
            public = handle.read()
    provider = Provider(args.expires_in)
    socks = [listening() for _ in range(3)]
    issuer = f"http://127.0.0.1:{socks[0].getsockname()[1]}"
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}/mcp" for s in socks[1:]]
    apps = [authorization_server(provider, issuer, public)]
    apps += [resource_server(n, provider, issuer, u) for n, u in zip("AB", urls, strict=True)]
    servers = [uvicorn.Server(uvicorn.Config(a, log_level="warning", lifespan="on")) for a in apps]
    threads = [
        threading.Thread(target=s.run, kwargs={"sockets": [k]}, daemon=True)
        for s, k in zip(servers, socks, strict=True)
    ]
    for thread in threads:
        thread.start()
    sys.stdout.write(f"AS={issuer} A={urls[0]} B={urls[1]}\n")
    sys.stdout.flush()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
