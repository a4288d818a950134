"""A loopback HTTPS server with a throwaway self-signed certificate (tests and bench/sandbox.py).

The certificate is made with ``cryptography``, which the MCP SDK already depends on.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.tls import TLSListener
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BODY = b"hello through the sandbox\n"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files for ``localhost`` and ``127.0.0.1``, valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=36500))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@asynccontextmanager
async def https_server(directory: Path) -> AsyncGenerator[tuple[int, Path]]:
    """A loopback HTTPS server answering every GET with ``BODY``; yields (port, CA file)."""
    cert, key = self_signed(directory)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = int(tcp.extra(anyio.abc.SocketAttribute.local_port))
    listener = TLSListener(tcp, context, standard_compatible=False)

    async def handle(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode()
                await stream.send(head + BODY)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError, ssl.SSLError):
                pass

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield port, cert
        finally:
            tg.cancel_scope.cancel()
