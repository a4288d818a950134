"""What a 401 or 403 from a Streamable HTTP server means, and what the user should do about it.

One small pure function, ``auth_failure``, so that an OAuth login flow can extend it: given the
server's settings, the HTTP status and the ``WWW-Authenticate`` header the server sent, it gives
the sentence for the error, the remedy and the fields the error carries. It advises ``secret_env``
only when the server's ``headers`` declare one; it says so when the server asks for OAuth (a
``Bearer`` challenge with ``resource_metadata``, RFC 9728 section 5.1, as the MCP authorization
specification requires). The header is server-provided text: only a cleaned URL (scheme, host,
path) of its ``resource_metadata`` is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from truss.contract import SecretHeader, Server
from truss.mcp._errmap import safe_url

__all__ = ["AUTH_FAILED", "AuthFailure", "auth_failure"]

AUTH_FAILED = "auth_failed"  # the ``cause`` of a connect or a call refused with 401 or 403
_RESOURCE_METADATA = re.compile(r'resource_metadata\s*=\s*"([^"]{1,2048})"', re.IGNORECASE)
_MAX_HEADER = 8192


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
    what = "refused the credentials" if secret_headers else "requires authentication"
    text = f"HTTP status {status}: the server {what}"
    if metadata is not None:
        fields["oauth"] = True
        fields["resource_metadata"] = safe_url(metadata.group(1))
        text += f" and asks for OAuth authorization (resource metadata at {fields['resource_metadata']})"
        remedy = (
            "Truss does not run an OAuth login itself: get a token for this server and pass it in a header "
            '(headers = { Authorization = { secret_env = "TOKEN", format = "Bearer {}" } }), or connect '
            "with an auth flow that logs in (docs/mcp.md, auth flows)"
        )
        if secret_headers:
            remedy = f"The token in {_names(secret_headers)} was refused: it may have expired. " + remedy
    elif secret_headers:
        remedy = f"Check the secret_env variables the server's headers read ({_names(secret_headers)})"
    elif status == 403:
        remedy = "The server refuses this client; check with its operator which credentials it expects"
    else:
        remedy = (
            "The server declares no credentials; if it takes a token, add "
            'headers = { Authorization = { secret_env = "TOKEN", format = "Bearer {}" } } and export TOKEN'
        )
    return AuthFailure(text, remedy, fields)


def _names(headers: dict[str, str]) -> str:
    return ", ".join(f"{header} from {env}" for header, env in sorted(headers.items()))
