"""OAuth 2.1 against a real authorization server and OAuth-protected MCP servers on 127.0.0.1.

``servers/oauth_servers.py`` runs the MCP SDK's own authorization server and two SDK MCP servers
(A and B) that accept only tokens issued for themselves. Truss runs as a subprocess, as a user
runs it; a person's login is a "browser" script (``BROWSER``) that follows the authorization URL
and lands on Truss's loopback redirect, as a browser would.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.conftest import truss_cmd
from tests.mcp._util import SERVERS
from tests.mcp.conftest import _read_marker, _stop  # pyright: ignore[reportPrivateUsage]

TIMEOUT = 120
BROWSER = Path(__file__).resolve().parent / "data" / "oauth_browser.py"


@dataclass(frozen=True)
class Servers:
    issuer: str
    a: str
    b: str
    key: Path

    def admin(self, what: str) -> Any:
        method = "GET" if what == "log" else "POST"
        request = urllib.request.Request(
            f"{self.issuer}/admin/{what}", method=method, data=None if method == "GET" else b""
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback test server
            return json.loads(response.read())


def _keypair(tmp: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = tmp / "jwt.key", tmp / "jwt.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def _start(tmp: Path, *extra: str) -> Iterator[Servers]:
    private, public = _keypair(tmp)
    process = subprocess.Popen(
        [sys.executable, str(SERVERS / "oauth_servers.py"), "--jwt-public-key", str(public), *extra],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = _read_marker(process.stdout, "AS=", 30)
        issuer, a, b = line.split()[0], line.split()[1][2:], line.split()[2][2:]
        yield Servers(issuer, a, b, private)
    finally:
        _stop(process)


@pytest.fixture
def oauth(tmp_path: Path) -> Iterator[Servers]:
    yield from _start(tmp_path)


@pytest.fixture
def short_lived(tmp_path: Path) -> Iterator[Servers]:
    """Access tokens that live 10 s: within the refresh margin, so every later use refreshes first."""
    yield from _start(tmp_path, "--expires-in", "10")


@pytest.fixture
def home(truss_home: Path) -> Path:
    done = truss(truss_home, "init")
    assert done.returncode == 0, done.stderr
    return truss_home


def truss(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ["TRUSS_HOME"] = str(home)
    environ["BROWSER"] = f"{sys.executable} {BROWSER} %s"
    environ.update(env or {})
    return subprocess.run(
        [*truss_cmd(), *args], capture_output=True, text=True, env=environ, timeout=TIMEOUT, check=False
    )


def contract(
    path: Path,
    servers: list[dict[str, Any]],
    steps: list[tuple[str, dict[str, Any]]],
    *checks: tuple[str, str],
    **extra: Any,
) -> Path:
    """A contract calling ``steps``; each check (tool, regex) must match that tool's result."""
    data: dict[str, Any] = {
        "done": {"checks": [{"kind": "result_matches", "tool": t, "pointer": "", "regex": r} for t, r in checks]},
        "contract": {"name": "oauth-test", "intent": "call OAuth servers"},
        "agent": {"provider": "scripted", "steps": [{"tool": t, "arguments": a} for t, a in steps]},
        "budget": {"deadline": "60s", "call_timeout": "20s"},
        "mcp": {"servers": servers},
        **extra,
    }
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


def server(name: str, url: str, oauth: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "transport": "http", "url": url, "allow_tools": ["echo", "whoami", "leak"],
            "connect_timeout": "20s", "oauth": oauth, **extra}  # fmt: skip


CC = {"grant": "client_credentials", "client_id": "cc-client", "client_secret_env": "CC_SECRET"}
CC_ENV = {"CC_SECRET": "cc-secret-value"}


def entries(home: Path, session: str) -> list[dict[str, Any]]:
    shown = truss(home, "--json", "ledger", "show", session)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["entries"]


def results(home: Path, session: str) -> list[str]:
    return [json.dumps(e["entry"]["body"]) for e in entries(home, session) if e["kind"] == "mcp_tool_call"]


def ran(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


# -- headless grants ------------------------------------------------------------------------------


def test_client_credentials_run_needs_no_login_and_records_only_non_secret_facts(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CC)], [("mcp:a:whoami", {})],
                    ("mcp:a:whoami", "^cc-client mcp:read$"))  # fmt: skip
    out = ran(truss(home, "--json", "run", str(file), env=CC_ENV))
    started = next(e for e in entries(home, out["session"]) if e["kind"] == "session_started")
    auth = started["entry"]["body"]["servers"]["a"]["auth"]
    assert auth["kind"] == "oauth" and auth["grant"] == "client_credentials"
    assert auth["identity"]["issuer"].rstrip("/") == oauth.issuer and auth["identity"]["client_id"] == "cc-client"
    assert auth["scopes"] == ["mcp:read"]
    assert [r["grant"] for r in oauth.admin("log")] == ["client_credentials"]


def test_private_key_jwt_run_signs_an_assertion_and_needs_no_login(oauth: Servers, home: Path, tmp_path: Path) -> None:
    jwt = {"grant": "private_key_jwt", "client_id": "jwt-client", "private_key_file": str(oauth.key),
           "issuer": oauth.issuer}  # fmt: skip
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, jwt)], [("mcp:a:whoami", {})],
                    ("mcp:a:whoami", "^jwt-client mcp:read$"))  # fmt: skip
    assert ran(truss(home, "--json", "run", str(file)))["status"] == "pass"


# -- the authorization code grant: one login, then unattended runs ---------------------------------

CODE: dict[str, Any] = {"grant": "authorization_code"}


def logged_in(home: Path, file: Path, name: str = "a") -> dict[str, Any]:
    done = truss(home, "--json", "mcp", "login", name, "--contract", str(file), "--timeout", "60s")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_run_without_a_login_stops_before_any_call_naming_truss_mcp_login(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], [("mcp:a:echo", {"text": "hi"})])
    done = truss(home, "--json", "run", str(file))
    assert done.returncode == 5, done.stdout + done.stderr
    assert "truss mcp login a" in json.loads(done.stdout)["reason"]
    assert oauth.admin("log") == []  # nothing was asked of the authorization server


def test_login_then_runs_refresh_before_the_first_call_and_status_shows_no_token(
    short_lived: Servers, home: Path, tmp_path: Path
) -> None:
    file = contract(tmp_path / "c.toml", [server("a", short_lived.a, CODE)], [("mcp:a:whoami", {})],
                    ("mcp:a:whoami", "mcp:read"))  # fmt: skip
    facts = logged_in(home, file)
    assert facts["issuer"].rstrip("/") == short_lived.issuer and facts["refreshable"] is True
    out = ran(truss(home, "--json", "run", str(file)))
    assert out["status"] == "pass"
    # The token lives 10 s, inside the refresh margin: the run refreshed it before its first call.
    assert [r["grant"] for r in short_lived.admin("log")] == ["authorization_code", "refresh_token"]
    status = truss(home, "--json", "mcp", "auth", "status")
    assert status.returncode == 0
    grants = json.loads(status.stdout)["grants"]
    assert [g["server"] for g in grants] == ["a"] and grants[0]["scopes"] == ["mcp:read"]
    assert "canary-" not in status.stdout
