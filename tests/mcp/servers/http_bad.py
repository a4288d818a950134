"""A small Streamable HTTP MCP server on 127.0.0.1 that misbehaves by path (stdlib only, fast start).

Prints ``PORT=<n>`` on stdout once listening. Paths:

    /status401/mcp  every request gets 401
    /status403/mcp  every request gets 403
    /status500/mcp  every request gets 500
    /drip/mcp       every POST gets a 200 event stream that drips comments and never an event
    /ok/mcp         a plain JSON-response server (2025-11-25 handshake) with tools echo and slow;
                    ``slow`` drips comments instead of answering
    /auth/mcp       as /ok, but only with ``Authorization: Bearer right-token``; else 401
    /oauth/mcp      every request gets 401 with a ``WWW-Authenticate`` naming ``resource_metadata`` (RFC 9728)
    /expire/mcp     as /ok, but ``tools/call`` gets 401 (a credential that stops working mid-run)
    /forbid/mcp     as /ok, but ``tools/call`` gets 403 (a client the server stops accepting mid-run)
    anything else   404 (a URL without the ``/mcp`` endpoint path)
    /bare-result/mcp  a 2026-07-28 server (``server/discover``) whose ``tools/call`` result has no
                    ``resultType``, which SEP-2322 says a client must read as ``complete``
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [
    {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}},
    {"name": "slow", "description": "Never answers, slowly.", "inputSchema": {"type": "object"}},
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 401 and self.path.startswith("/oauth/"):
            port = self.server.server_address[1]
            metadata = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/oauth/mcp"
            self.send_header("WWW-Authenticate", f'Bearer resource_metadata="{metadata}", scope="mcp"')
        elif status == 401:
            self.send_header("WWW-Authenticate", 'Bearer error="invalid_token"')
        self.end_headers()
        self.wfile.write(body)

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                self.wfile.write(b": still working\n\n")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            return

    def do_GET(self) -> None:
        self._reply(405)

    def do_DELETE(self) -> None:
        self._reply(200)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        kind = self.path.split("/")[1]
        if not self.path.split("?")[0].endswith("/mcp"):
            self._reply(404, b"not found")
            return
        if kind in ("status401", "oauth"):
            self._reply(401, b'{"error": "unauthorized"}')
            return
        if kind == "status403":
            self._reply(403, b'{"error": "forbidden"}')
            return
        if kind == "status500":
            self._reply(500, b"boom")
            return
        if kind == "drip":
            self._drip()
            return
        if kind == "auth" and self.headers.get("Authorization") != "Bearer right-token":
            self._reply(401, b'{"error": "unauthorized"}')
            return
        message = json.loads(raw)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            self._reply(202)
            return
        if kind == "bare-result":
            self._modern(method, request_id)
            return
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "http-bad", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call" and kind == "expire":
            self._reply(401, b'{"error": "token expired"}')
            return
        elif method == "tools/call" and kind == "forbid":
            self._reply(403, b'{"error": "forbidden"}')
            return
        elif method == "tools/call" and message["params"]["name"] == "slow":
            self._drip()
            return
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "echo"}]}
        elif method == "ping":
            result = {}
        else:
            body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}}
            self._reply(200, json.dumps(body).encode())
            return
        self._reply(200, json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode())

    def _modern(self, method: str, request_id: object) -> None:
        cached = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
        if method == "server/discover":
            result: dict[str, object] = {
                **cached,
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "http-bad-modern", "version": "1"},
            }
        elif method == "tools/list":
            result = {**cached, "tools": TOOLS[:1]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "no resultType here"}]}
        else:
            body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}}
            self._reply(200, json.dumps(body).encode())
            return
        self._reply(200, json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode())


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"PORT={server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
