"""``https_server.py CERT KEY [BYTES]``: a loopback HTTPS server in its own process; prints its port, serves.

Every GET gets a fixed body (a short line, or BYTES bytes). The benchmark's stand-in for a remote
host (bench/sandbox.py), so that the server does not share the egress proxy's event loop.
"""

from __future__ import annotations

import http.server
import ssl
import sys

BODY = b"hello through the sandbox\n"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


if len(sys.argv) > 3:
    BODY = b"x" * int(sys.argv[3])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
