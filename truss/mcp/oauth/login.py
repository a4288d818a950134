"""``truss mcp login``: the one interactive step, run by a person, before unattended runs.

The authorization code flow with PKCE, once: Truss prints the authorization URL (and opens it in
a browser when one is there: Python's ``webbrowser``, which honours ``BROWSER``), and receives the
redirect either on a loopback listener on 127.0.0.1 (port ``redirect_port`` when the contract
fixes one, else any free port) or, with ``paste``, as the URL the person pastes from the browser's
address bar (a machine without a browser: open the URL anywhere, paste where it lands). The
tokens go to the ``TokenStore``; nothing is recorded in the ledger.

A login replaces the grant stored for the server's (issuer, resource) and asks for the scopes the
contract names, plus those the previous grant held and those a headless step-up asked for, so
"log in again" after a step-up gets the union (SEP-2350).
"""

from __future__ import annotations

import hmac
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
from mcp.shared.auth import AuthorizationCodeResult

from truss._clock import Clock
from truss._errors import ServerStartError, TrussError, UsageError
from truss.contract import Contract
from truss.mcp.oauth.flow import Interactive, OAuthFlows, resource_of
from truss.mcp.oauth.store import TokenStore
from truss.redaction import remember_secret

__all__ = ["PASTE_PORT", "login", "parse_redirect"]

PASTE_PORT = 8976
"""The loopback port in the redirect URI of a pasted login when the contract fixes none (nothing listens)."""

_PAGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"Truss received the authorization. You can close this window.\n"
)
_NOT_OURS = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"This is not the authorization Truss is waiting for (its state does not match, or it has no code):"
    b" Truss ignored it and is still waiting for the login you started.\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def parse_redirect(url: str) -> AuthorizationCodeResult:
    """The code, state and issuer of a redirect URL (or of its query alone)."""
    text = url.strip()
    query = urlsplit(text).query if "://" in text or text.startswith("/") else text.lstrip("?")
    values = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
    if "error" in values:
        raise ServerStartError(
            f"the authorization server refused the login: {values['error']}"
            + (f" ({values['error_description'][:200]})" if values.get("error_description") else ""),
            remedy="Try `truss mcp login` again, and approve the request in the browser",
            cause="login_refused",
        )
    code = values.get("code")
    if not code:
        raise UsageError(
            "the redirect URL holds no authorization code",
            remedy="Paste the whole URL the browser was sent to after you approved (it has ?code=...)",
        )
    remember_secret(code)
    return AuthorizationCodeResult(code=code, state=values.get("state"), iss=values.get("iss"))


class _Loopback:
    """The redirect's landing place on 127.0.0.1: the ``GET /callback?...`` that carries the state
    of the authorization URL Truss showed ends the wait.

    Any local process, or a web page the person has open, can reach the listener before the
    browser does. A callback with another state, or none, or with neither a code nor an error, is
    answered 400 and the wait goes on (the login's own timeout still bounds it); taking it would
    not leak the login (the SDK checks the state too) but would break it."""

    def __init__(self) -> None:
        self.state: str | None = None
        self.result: AuthorizationCodeResult | BaseException | None = None
        self.arrived = anyio.Event()

    def expect(self, authorization_url: str) -> None:
        self.state = parse_qs(urlsplit(authorization_url).query).get("state", [None])[0]

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            with anyio.move_on_after(10):
                while b"\r\n\r\n" not in data and len(data) < 16384:
                    chunk = await stream.receive(4096)
                    if not chunk:
                        break
                    data += chunk
            line = data.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            if len(parts) < 2 or parts[0] != "GET" or urlsplit(parts[1]).path != "/callback" or self.arrived.is_set():
                await stream.send(_NOT_FOUND)
                return
            if not self._ours(parts[1]):
                await stream.send(_NOT_OURS)
                return
            try:
                self.result = parse_redirect(parts[1])
            except Exception as exc:
                self.result = exc
            await stream.send(_PAGE)
            self.arrived.set()

    def _ours(self, target: str) -> bool:
        values = parse_qs(urlsplit(target).query, keep_blank_values=True)
        state = values.get("state", [""])[0]
        if self.state is None or not state or not hmac.compare_digest(state.encode(), self.state.encode()):
            return False
        return bool(values.get("code", [""])[0] or values.get("error", [""])[0])


async def login(
    contract: Contract,
    name: str,
    *,
    store: TokenStore,
    clock: Clock,
    log_dir: Path,
    say: Callable[[str], None],
    read_line: Callable[[], str],
    paste: bool = False,
    browser: bool = True,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Log in to server ``name`` of ``contract``; the stored grant's facts (never a token)."""
    from truss.mcp.client import connect

    server = contract.mcp.server(name)
    if server is None:
        declared = ", ".join(s.name for s in contract.mcp.servers) or "none"
        raise UsageError(f"no MCP server named {name!r} is declared (declared: {declared})")
    if server.oauth is None:
        raise UsageError(
            f"MCP server {name!r} has no [mcp.servers.oauth] table, so there is nothing to log in to",
            remedy="Add [mcp.servers.oauth] to its table (docs/oauth.md)",
        )
    oauth = server.oauth
    resource = resource_of(server)
    previous = store.find(resource, oauth.issuer, oauth.client_id)
    scopes = list(oauth.scopes)
    if previous is not None:
        scopes += [s for s in [*previous.scopes, *previous.wanted_scopes] if s not in scopes]
        store.delete(resource, previous.issuer)
    updated = server.model_copy(
        update={"oauth": oauth.model_copy(update={"scopes": scopes}), "connect_timeout": f"{int(timeout_s)}s"}
    )
    only = contract.model_copy(update={"mcp": contract.mcp.model_copy(update={"servers": [updated]})})
    loopback = _Loopback()
    listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
    port = oauth.redirect_port
    if not paste and oauth.grant == "authorization_code":
        multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port or 0)
        first = multi.listeners[0]
        listener = first
        port = int(first.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610 - anyio, not Django
    redirect_uri = f"http://127.0.0.1:{port or PASTE_PORT}/callback"

    async def show(url: str) -> None:
        loopback.expect(url)
        say(f"Open this URL to let Truss use MCP server {name!r}:\n\n  {url}\n")
        if browser:
            opened = await anyio.to_thread.run_sync(webbrowser.open, url)
            if not opened:
                say("(no browser here: open the URL on any machine)")
        if paste:
            say(f"After you approve, the browser goes to {redirect_uri}?... (which may not load): paste that URL here.")

    async def wait() -> AuthorizationCodeResult:
        if paste:
            return parse_redirect(await anyio.to_thread.run_sync(read_line, abandon_on_cancel=True))
        await loopback.arrived.wait()
        if isinstance(loopback.result, BaseException):
            raise loopback.result
        assert loopback.result is not None
        return loopback.result

    flows = OAuthFlows(store, clock, interactive=Interactive(redirect_uri, show, wait))
    try:
        async with anyio.create_task_group() as tg:
            if listener is not None:
                tg.start_soon(listener.serve, loopback.handle)
            try:
                async with connect(only, log_dir=log_dir, clock=clock, auth=flows):
                    pass
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _first(group) from None
    finally:
        if listener is not None:
            await listener.aclose()
    stored = store.find(resource, oauth.issuer, oauth.client_id)
    if stored is None:
        raise ServerStartError(
            f"MCP server {name!r} accepted the connection without asking for a token, so there is nothing to store",
            remedy="Check the server's URL: it does not ask for OAuth",
            server=name,
            cause="no_oauth",
        )
    return stored.facts()


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error inside a task group's group (a Truss error first)."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(cast(BaseExceptionGroup[BaseException], current).exceptions)
        else:
            leaves.append(current)
    return next((e for e in leaves if isinstance(e, TrussError)), leaves[0] if leaves else group)
