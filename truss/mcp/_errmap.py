"""Mapping the exceptions of the MCP SDK, httpx2, anyio and the OS to Truss errors.

Every foreign exception that can leave a connect or a call is turned into a ``ServerStartError``
(at connect) or a ``ToolCallError`` (during a call) naming the server and the tool, with a
``cause`` from a small fixed vocabulary, the JSON-RPC ``code`` when there is one, and
``retryable``. The table is ordered most specific first; ``tests/mcp/test_errmap.py`` scans the
SDK for exception classes and fails when one falls through to the catch-all.

A JSON-RPC error the server answered with is ``server_error`` with its ``code``, whatever the code:
the SDK raises ``-32000`` itself when a connection closes and ``-32001`` when a request times out,
so an ``MCPError`` with one of those codes is ``connection_closed`` or ``timeout`` unless the
connection's wire saw the server answer the call's request with it (``answered``,
``truss.mcp._wire.CallSlot``).

What this module does not do: decide whether a call is re-sent (the gate does, from the
contract), or put an exception's text in a message when that text could hold a secret (HTTP
errors carry the request URL; ``truss._credentials.display_url`` shows a URL with its user
info masked, without its query or fragment).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import anyio
import httpx2
import pydantic
from mcp import MCPError, types
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.client.extension import UnexpectedClaimedResult
from mcp.client.streamable_http import StreamableHTTPError
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.auth import InvalidRedirectUriError, InvalidScopeError

from truss._errors import McpError, ServerStartError, ToolCallError

__all__ = ["Mapped", "classify", "leaves", "to_call_error", "to_start_error"]

# cause, retryable, readable text
Mapped = tuple[str, bool, str, int | None]


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The non-group exceptions inside (nested) exception groups, depth first."""
    if isinstance(exc, BaseExceptionGroup):
        group = cast(BaseExceptionGroup[BaseException], exc)
        for inner in group.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def _mcp_error(exc: MCPError, answered: tuple[int, str] | None) -> Mapped:
    code = exc.code
    by_server = answered is not None and answered[0] == code
    if code == types.REQUEST_TIMEOUT and not by_server:
        return "timeout", True, "the server did not answer within the timeout", code
    if code == types.CONNECTION_CLOSED and not by_server:
        return "connection_closed", True, "the connection to the server closed (it exited or crashed)", code
    # The server's message is untrusted text: keep it short and on one line.
    message = "".join(c if c.isprintable() else "?" for c in " ".join(str(exc.message).split()))[:200]
    return "server_error", False, f"the server answered with JSON-RPC error {code}: {message}", code


def classify(exc: BaseException, answered: tuple[int, str] | None = None) -> Mapped:
    """(cause, retryable, text, code) for one leaf exception, most specific first; ``answered`` is
    the (code, message) of the error the server answered the request with, when the wire saw one."""
    if isinstance(exc, MCPError):
        return _mcp_error(exc, answered)
    if isinstance(exc, TimeoutError):
        return "timeout", True, "no answer within the timeout", None
    if isinstance(exc, httpx2.TimeoutException):
        return "timeout", True, f"HTTP {type(exc).__name__}", None
    if isinstance(exc, httpx2.HTTPStatusError):
        return "transport", exc.response.status_code >= 500, f"HTTP status {exc.response.status_code}", None
    if isinstance(exc, httpx2.HTTPError | httpx2.InvalidURL | httpx2.CookieConflict | httpx2.StreamError):
        return "transport", True, f"HTTP transport failed ({type(exc).__name__})", None
    if isinstance(exc, StreamableHTTPError):
        return "transport", True, f"Streamable HTTP failed ({type(exc).__name__})", None
    if isinstance(exc, OAuthFlowError | InvalidScopeError | InvalidRedirectUriError):
        return "transport", False, f"HTTP authorization failed ({type(exc).__name__})", None
    if isinstance(exc, SubscriptionLost):
        return "connection_closed", True, "the server dropped its change subscription", None
    if isinstance(exc, ListenNotSupportedError):
        return "protocol_error", False, "the server does not support change subscriptions", None
    if isinstance(exc, UnexpectedClaimedResult):
        return "invalid_result", False, "the server returned a result shape Truss does not accept", None
    if isinstance(exc, pydantic.ValidationError):
        return "invalid_result", False, "the server sent a message that does not follow the MCP schema", None
    if isinstance(exc, UnicodeError):
        return "transport", False, "the server wrote bytes that are not UTF-8 to its protocol stream", None
    if isinstance(exc, FileNotFoundError):
        return "transport", False, "the command was not found", None
    if isinstance(exc, PermissionError):
        return "transport", False, "the command is not executable (permission denied)", None
    if isinstance(exc, anyio.BrokenResourceError | anyio.ClosedResourceError | anyio.EndOfStream):
        return "connection_closed", True, "the connection to the server closed", None
    if isinstance(exc, anyio.BusyResourceError | anyio.WouldBlock):
        return "transport", True, f"the transport was busy ({type(exc).__name__})", None
    if isinstance(exc, OSError):
        return "transport", True, f"operating system error ({type(exc).__name__}, errno {exc.errno})", None
    if isinstance(exc, RuntimeError):
        # The SDK raises RuntimeError for a result that violates the tool's outputSchema and for
        # exhausted input_required rounds (InputRequiredRoundsExceededError).
        return "invalid_result", False, f"the server's result was refused ({_short(exc)})", None
    if isinstance(exc, ValueError):
        return "invalid_result", False, f"the server's answer could not be used ({type(exc).__name__})", None
    if isinstance(exc, Warning):
        # Only under warnings-as-errors: the SDK flagged a deprecated protocol feature.
        return "protocol_error", False, f"the SDK refused a deprecated protocol feature ({type(exc).__name__})", None
    return "transport", False, f"unexpected {type(exc).__name__}", None


def is_unmapped(exc: BaseException) -> bool:
    """True when ``classify`` would use its catch-all for ``exc`` (the mapping test uses this)."""
    return classify(exc)[2] == f"unexpected {type(exc).__name__}"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] if text else type(exc).__name__


def _first_leaf(exc: BaseException) -> BaseException:
    found = list(leaves(exc))
    # Prefer the most telling leaf: a JSON-RPC error or a timeout over teardown noise.
    for leaf in found:
        if isinstance(leaf, MCPError | TimeoutError | OSError | httpx2.HTTPError):
            return leaf
    return found[0] if found else exc


def to_call_error(
    exc: BaseException,
    *,
    server: str,
    tool: str,
    timeout_s: float | None = None,
    answered: tuple[int, str] | None = None,
) -> McpError:
    """A ``ToolCallError`` for a failed call (already-Truss errors pass through); ``answered`` as for ``classify``."""
    if isinstance(exc, McpError):
        return exc
    leaf = _first_leaf(exc)
    if isinstance(leaf, McpError):
        return leaf
    cause, retryable, text, code = classify(leaf, answered)
    if cause == "timeout" and timeout_s is not None:
        text = f"no answer within {timeout_s:g} s"
    return ToolCallError(
        f"calling tool {tool!r} on MCP server {server!r} failed: {text}",
        remedy=_remedy(cause),
        retryable=retryable,
        server=server,
        tool=tool,
        cause=cause,
        code=code,
        exception=type(leaf).__name__,
    )


def to_start_error(
    exc: BaseException,
    *,
    server: str,
    text: str | None = None,
    cause: str | None = None,
    retryable: bool | None = None,
    **fields: Any,
) -> McpError:
    """A ``ServerStartError`` for a failed connect (already-Truss errors pass through). ``text``,
    ``cause`` and ``retryable`` replace what the exception's class alone would say."""
    if isinstance(exc, McpError):
        return exc
    leaf = _first_leaf(exc)
    if isinstance(leaf, McpError):
        return leaf
    leaf_cause, leaf_retryable, leaf_text, code = classify(leaf)
    status = fields.get("status")
    if text is None:
        text = f"HTTP status {status} ({leaf_text})" if status is not None else leaf_text
    cause = cause or leaf_cause
    retryable = leaf_retryable if retryable is None else retryable
    remedy = fields.pop("remedy", None) or _start_remedy(cause, status)
    if fields.get("stderr_log"):
        remedy += f"; its stderr is in {fields['stderr_log']}"
    return ServerStartError(
        f"MCP server {server!r} could not be started or connected: {text}",
        remedy=remedy,
        retryable=retryable,
        server=server,
        cause=cause,
        code=code,
        exception=type(leaf).__name__,
        **fields,
    )


def _remedy(cause: str) -> str:
    return {
        "timeout": "Raise call_timeout for this server or tool if the work needs longer, or check the server",
        "connection_closed": "The server exited; its stderr log says why",
        "server_error": "The server answered the call with an error; check the arguments against the tool's input "
        "schema, or the server's stderr log",
        "protocol_error": "The server broke the MCP protocol; report it upstream",
        "invalid_result": "The server's answer broke the MCP schema or the tool's outputSchema; report it upstream",
        "transport": "Check that the server is reachable and healthy; its stderr log may say more",
    }.get(cause, "Check the server")


def _start_remedy(cause: str, status: int | None) -> str:
    if status in (401, 403):
        return "The server refused the credentials: check the secret_env variables named in the server's headers"
    if cause == "timeout":
        return "The server did not finish its handshake: raise connect_timeout, or check it speaks MCP on stdout"
    return "Check the server's command, arguments or URL"
