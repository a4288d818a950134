"""OAuth 2.1 for remote MCP servers (docs/oauth.md): the auth flow, the token store, the login.

``OAuthFlows`` (``flow``) is the ``HttpAuth`` that gives a server with ``[mcp.servers.oauth]`` the
MCP SDK's own OAuth provider; ``TokenStore`` (``store``) keeps tokens outside the ledger, keyed by
(issuer, resource); ``login`` (``login``) runs the interactive authorization code flow once for
``truss mcp login``, with a loopback redirect on 127.0.0.1 or a pasted redirect URL.
"""

from truss.mcp.oauth.flow import REFRESH_MARGIN_S, Interactive, OAuthFlows, resource_of
from truss.mcp.oauth.store import Grant, TokenStore, keyring_usable

__all__ = ["REFRESH_MARGIN_S", "Grant", "Interactive", "OAuthFlows", "TokenStore", "keyring_usable", "resource_of"]
