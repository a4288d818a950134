"""An SDK 2.x MCPServer over Streamable HTTP on 127.0.0.1 (serves the 2026-07-28 era), behind a
bearer check. Prints ``PORT=<n>`` once listening. The token is the first argument."""

from __future__ import annotations

import hmac
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.responses import JSONResponse

app = MCPServer("modern-http", version="2.0", instructions="A 2026-era HTTP test server.")


@app.tool()
def echo(text: str) -> str:
    """Echo the text."""
    return text


@app.tool()
async def work(steps: int, ctx: Context) -> str:
    """Report progress."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    return f"did {steps} steps"


class Bearer:
    def __init__(self, inner: Any, token: str) -> None:
        self.inner, self.expected = inner, f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse({"error": "unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.inner(scope, receive, send)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before PORT= is printed: a client that connects before uvicorn has started waits in
    # the backlog instead of being refused.
    sock.listen(128)
    sys.stdout.write(f"PORT={sock.getsockname()[1]}\n")
    sys.stdout.flush()
    asgi = Bearer(app.streamable_http_app(stateless_http=True), sys.argv[1])
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
