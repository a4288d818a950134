"""What an OAuth-protected MCP server says about itself before anyone logs in (``truss mcp probe``).

One unauthenticated ``initialize`` POST; a 401 (or 403) with ``WWW-Authenticate`` leads to the
protected resource metadata (RFC 9728, with the SDK's fallback order of well-known URLs) and from
it to the authorization server's metadata (RFC 8414 / OpenID discovery). Reported: the resource,
its authorization servers, scopes (supported, and what the challenge asks for), grants, token
endpoint auth methods, PKCE methods, whether dynamic registration and client ID metadata
documents are offered. Read-only: nothing is registered, no token is asked for.
"""

from __future__ import annotations

from typing import Any

import httpx2
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_oauth_metadata_request,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    handle_auth_metadata_response,
    handle_protected_resource_response,
)

__all__ = ["discover"]

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "truss", "version": "0"}},
}


async def discover(url: str, *, timeout_s: float) -> dict[str, Any] | None:
    """The OAuth facts of the MCP server at ``url``; None when it does not ask for OAuth."""
    async with httpx2.AsyncClient(timeout=timeout_s) as http:
        challenge = await http.post(url, json=_INITIALIZE, headers={"Accept": "application/json, text/event-stream"})
        if challenge.status_code not in (401, 403):
            return None
        found: dict[str, Any] = {
            "status": challenge.status_code,
            "challenge_scope": extract_scope_from_www_auth(challenge),
        }
        prm = None
        for candidate in build_protected_resource_metadata_discovery_urls(
            extract_resource_metadata_from_www_auth(challenge), url
        ):
            try:
                prm = await handle_protected_resource_response(
                    await http.send(create_oauth_metadata_request(candidate))
                )
            except Exception:  # noqa: S112 - a broken document: try the next well-known URL
                continue
            if prm is not None:
                found["resource_metadata_url"] = candidate
                break
        servers: list[str] = []
        if prm is not None:
            servers = [str(s) for s in prm.authorization_servers]
            found.update(
                resource=str(prm.resource), authorization_servers=servers, scopes_supported=prm.scopes_supported
            )
        for candidate in build_oauth_authorization_server_metadata_discovery_urls(servers[0] if servers else None, url):
            try:
                ok, metadata = await handle_auth_metadata_response(
                    await http.send(create_oauth_metadata_request(candidate))
                )
            except Exception:  # noqa: S112 - as above
                continue
            if not ok:
                break
            if metadata is not None:
                found["authorization_server"] = {
                    "metadata_url": candidate,
                    "issuer": str(metadata.issuer),
                    "grant_types_supported": metadata.grant_types_supported,
                    "scopes_supported": metadata.scopes_supported,
                    "token_endpoint_auth_methods_supported": metadata.token_endpoint_auth_methods_supported,
                    "code_challenge_methods_supported": metadata.code_challenge_methods_supported,
                    "dynamic_registration": metadata.registration_endpoint is not None,
                    "client_id_metadata_document_supported": metadata.client_id_metadata_document_supported,
                }
                break
        return found
