"""The one place a 401 or 403 from a Streamable HTTP server becomes the error the user sees.

Every path goes through here: a refusal at connect (``refused_at_connect``) or during a call
(``refused_call``), with static headers or with an OAuth flow, and an error the OAuth flow
itself raised inside the transport (``flow_failure``: a login needed, a refresh refused, a scope
step-up past its bound), which the transport reports only as a closed connection. The wording is
one pure function, ``auth_failure``: given the server's settings, the HTTP status and the
``WWW-Authenticate`` header the server sent, it gives the sentence for the error, the remedy and
the fields the error carries. It advises ``secret_env`` only when the server's ``headers`` declare
one; it says so when the server asks for OAuth (a ``Bearer`` challenge with ``resource_metadata``,
RFC 9728 section 5.1, as the MCP authorization specification requires), and points at
``[mcp.servers.oauth]`` and ``truss mcp login``. The header is server-provided text: only a cleaned
URL (scheme, host, path) of its ``resource_metadata`` is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from truss._credentials import display_url
from truss._errors import McpError, ToolCallError
from truss.contract import SecretHeader, Server
from truss.mcp._errmap import to_start_error

__all__ = [
    "AUTH_FAILED",
    "AuthFailure",
    "auth_failure",
    "call_refusal",
    "flow_failure",
    "refused_at_connect",
    "refused_call",
]

AUTH_FAILED = "auth_failed"  # the ``cause`` of a connect or a call refused with 401 or 403
_RESOURCE_METADATA = re.compile(r'resource_metadata\s*=\s*"([^"]{1,2048})"', re.IGNORECASE)
_MAX_HEADER = 8192
_HEADER_EXAMPLE = 'headers = { Authorization = { secret_env = "TOKEN", format = "Bearer {}" } }'


@dataclass(frozen=True)
class AuthFailure:
    """The explanation of one refusal: ``text`` (what happened), ``remedy``, ``fields`` for the error."""

    text: str
    remedy: str
    fields: dict[str, Any] = field(default_factory=dict[str, Any])


def auth_failure(server: Server, status: int, www_authenticate: str | None) -> AuthFailure:
    """Explain an HTTP ``status`` of 401 or 403 from ``server`` (see the module docstring)."""
    challenge = (www_authenticate or "")[:_MAX_HEADER]
    metadata = _RESOURCE_METADATA.search(challenge)
    fields: dict[str, Any] = {"status": status}
    secret_headers = {name: h.secret_env for name, h in server.headers.items() if isinstance(h, SecretHeader)}
    oauth = server.oauth
    what = "refused the credentials" if secret_headers or oauth is not None else "requires authentication"
    text = f"HTTP status {status}: the server {what}"
    if metadata is not None:
        fields["oauth"] = True
        fields["resource_metadata"] = display_url(metadata.group(1))
        text += f" and asks for OAuth authorization (resource metadata at {fields['resource_metadata']})"
    if oauth is not None:
        remedy = (
            f"The OAuth token Truss got for it (its [mcp.servers.oauth] table, the {oauth.grant} grant) was "
            f"refused: log in again with `truss mcp login {server.name}`, and check the grant's scopes and "
            "the client's access at the authorization server (docs/oauth.md)"
        )
    elif metadata is not None:
        remedy = (
            f"Give the server an [mcp.servers.oauth] table and log in once with `truss mcp login {server.name}` "
            f"(docs/oauth.md), or get a token for it and pass it in a header ({_HEADER_EXAMPLE})"
        )
        if secret_headers:
            remedy = f"The token in {_names(secret_headers)} was refused: it may have expired. " + remedy
    elif secret_headers:
        remedy = f"Check the secret_env variables the server's headers read ({_names(secret_headers)})"
    elif status == 403:
        remedy = "The server refuses this client; check with its operator which credentials it expects"
    else:
        remedy = f"The server declares no credentials; if it takes a token, add {_HEADER_EXAMPLE} and export TOKEN"
    return AuthFailure(text, remedy, fields)


def flow_failure(flow: object) -> McpError | None:
    """The Truss error an auth flow raised inside the transport (which reports only a closed
    connection), taken once: an OAuth flow keeps it as ``failure`` (truss.mcp.oauth)."""
    failure = getattr(flow, "failure", None)
    if isinstance(failure, McpError):
        setattr(flow, "failure", None)  # noqa: B010 - a duck-typed seam attribute
        return failure
    return None


def refused_at_connect(
    exc: BaseException, server: Server, status: int, challenge: str | None, fields: dict[str, Any]
) -> McpError:
    """A connect the server refused with ``status`` 401 or 403; ``fields`` (the URL, ...) are kept."""
    failure = auth_failure(server, status, challenge)
    fields = {**fields, **failure.fields}
    return to_start_error(
        exc, server=server.name, text=failure.text, cause=AUTH_FAILED, retryable=False, remedy=failure.remedy, **fields
    )


def refused_call(server: Server, tool: str, status: int, challenge: str | None) -> ToolCallError:
    """A call the server refused with 401/403 (say, a token that expired): an authentication failure
    with the HTTP status, not the JSON-RPC error the SDK turns the response into."""
    failure = auth_failure(server, status, challenge)
    return ToolCallError(
        f"calling tool {tool!r} on MCP server {server.name!r} failed: {failure.text}",
        remedy=failure.remedy,
        retryable=False,
        server=server.name,
        tool=tool,
        cause=AUTH_FAILED,
        **failure.fields,
    )


def call_refusal(
    flow: object, server: Server, tool: str, *, refused: bool, challenge: tuple[int, str | None] | None
) -> McpError | None:
    """Why a failed call failed when authentication is the reason, else None: the auth flow's own
    error first (a login needed, a step-up), then a 401/403 the server answered the call with
    (``refused``: one arrived during it; ``challenge``: the last one's status and header)."""
    failure = flow_failure(flow)
    if failure is not None:
        return failure
    if refused and challenge is not None:
        return refused_call(server, tool, *challenge)
    return None


def _names(headers: dict[str, str]) -> str:
    return ", ".join(f"{header} from {env}" for header, env in sorted(headers.items()))
