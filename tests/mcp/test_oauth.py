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

import anyio
import pytest
import tomli_w

from tests.conftest import truss_cmd
from tests.mcp._util import SERVERS
from tests.mcp.conftest import _read_marker, _stop  # pyright: ignore[reportPrivateUsage]
from truss._clock import SystemClock
from truss.contract import Contract
from truss.mcp.client import connect
from truss.mcp.oauth import OAuthFlows, TokenStore
from truss.mcp.oauth.store import Grant

TIMEOUT = 120
BROWSER = Path(__file__).resolve().parent / "data" / "oauth_browser.py"


@dataclass(frozen=True)
class Servers:
    issuer: str
    a: str
    b: str
    key: Path

    def admin(self, what: str) -> Any:
        method = "GET" if what in ("log", "seen") else "POST"
        request = urllib.request.Request(
            f"{self.issuer}/admin/{what}", method=method, data=None if method == "GET" else b""
        )
        with urllib.request.urlopen(request, timeout=10) as response:
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
    return {"name": name, "transport": "http", "url": url, "allow_tools": ["echo", "whoami", "leak", "expire_tokens"],
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


def test_login_refuses_forged_callbacks_with_400_and_keeps_waiting_for_the_one_with_its_state(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    # A local process (or a page the user has open) reaching the loopback listener first, with a
    # wrong state, no state or no code, used to end the wait and so break the login.
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], [("mcp:a:whoami", {})],
                    ("mcp:a:whoami", "mcp:read"))  # fmt: skip
    forging = {"BROWSER": f"{sys.executable} {BROWSER} --forge-first %s"}
    done = truss(home, "--json", "mcp", "login", "a", "--contract", str(file), "--timeout", "60s", env=forging)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no browser here" not in done.stderr  # the browser exits 1 unless every forged callback got a 400
    assert json.loads(done.stdout)["issuer"].rstrip("/") == oauth.issuer
    assert grants(oauth) == ["authorization_code"]
    assert ran(truss(home, "--json", "run", str(file)))["status"] == "pass"


def grants(server: Servers) -> list[str]:
    return [r["grant"] for r in server.admin("log")]


def test_a_token_that_expires_mid_run_is_refreshed_and_the_call_retried(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    steps: list[tuple[str, dict[str, Any]]] = [
        ("mcp:a:whoami", {}), ("mcp:a:expire_tokens", {}), ("mcp:a:echo", {"text": "after"})
    ]  # fmt: skip
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], steps, ("mcp:a:echo", "^after$"))
    logged_in(home, file)
    assert ran(truss(home, "--json", "run", str(file)))["status"] == "pass"
    assert grants(oauth) == ["authorization_code", "refresh_token"]


def test_a_resumed_run_refreshes_a_token_that_expired_while_it_waited_for_approval(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    policy = {"default": "allow", "rules": [{"tool": "mcp:a:echo", "effect": "ask", "reason": "a person looks"}]}
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], [("mcp:a:echo", {"text": "later"})],
                    ("mcp:a:echo", "^later$"), policy=policy)  # fmt: skip
    logged_in(home, file)
    held = truss(home, "--json", "run", str(file))
    assert held.returncode == 3, held.stdout + held.stderr
    out = json.loads(held.stdout)
    oauth.admin("expire")  # the approval took longer than the token lives
    approved = truss(home, "--json", "approve", out["session"], out["waiting"][0])
    assert approved.returncode == 0, approved.stderr
    assert ran(truss(home, "--json", "resume", out["session"]))["status"] == "pass"
    assert grants(oauth) == ["authorization_code", "refresh_token"]


def test_a_revoked_refresh_token_stops_the_run_cleanly_with_the_login_message(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], [("mcp:a:echo", {"text": "x"})])
    logged_in(home, file)
    oauth.admin("revoke")
    done = truss(home, "run", str(file))
    assert done.returncode == 5, done.stdout + done.stderr
    assert "truss mcp login a" in done.stdout + done.stderr and "Traceback" not in done.stderr
    verify = truss(home, "ledger", "verify", "--all")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_token_for_server_a_is_never_sent_to_server_b(oauth: Servers, home: Path, tmp_path: Path) -> None:
    servers = [server("a", oauth.a, CODE), server("b", oauth.b, CODE)]
    steps: list[tuple[str, dict[str, Any]]] = [("mcp:a:whoami", {}), ("mcp:b:whoami", {})]
    file = contract(tmp_path / "c.toml", servers, steps)
    logged_in(home, file, "a")
    done = truss(home, "--json", "run", str(file))
    assert done.returncode == 5 and "truss mcp login b" in json.loads(done.stdout)["reason"]
    logged_in(home, file, "b")
    assert ran(truss(home, "--json", "run", str(file)))["status"] == "pass"
    seen = oauth.admin("seen")
    assert seen["A"] and seen["B"] and not set(seen["A"]) & set(seen["B"])
    resources = {r["resource"] for r in oauth.admin("log")}
    assert resources == {oauth.a, oauth.b}


def test_the_memo_never_answers_one_oauth_identity_with_another_identitys_result(
    oauth: Servers, home: Path, tmp_path: Path
) -> None:
    jwt = {"grant": "private_key_jwt", "client_id": "jwt-client", "private_key_file": str(oauth.key)}
    memo = [{"name": "whoami", "memo": "1h"}]
    first = contract(tmp_path / "cc.toml", [server("a", oauth.a, CC, tools=memo)], [("mcp:a:whoami", {})],
                     ("mcp:a:whoami", "^cc-client"))  # fmt: skip
    second = contract(tmp_path / "jwt.toml", [server("a", oauth.a, jwt, tools=memo)], [("mcp:a:whoami", {})],
                      ("mcp:a:whoami", "^jwt-client"))  # fmt: skip
    assert ran(truss(home, "--json", "run", str(first), env=CC_ENV))["status"] == "pass"
    assert ran(truss(home, "--json", "run", str(second)))["status"] == "pass"  # not the memoized cc-client answer
    again = ran(truss(home, "--json", "run", str(first), env=CC_ENV))
    assert again["status"] == "pass"
    calls = [e["entry"]["body"] for e in entries(home, again["session"]) if e["kind"] == "mcp_tool_call"]
    assert calls and calls[0].get("replayed_from")  # the same identity is answered from the memo


def test_canary_tokens_appear_nowhere_but_the_token_store(oauth: Servers, home: Path, tmp_path: Path) -> None:
    steps: list[tuple[str, dict[str, Any]]] = [("mcp:a:leak", {}), ("mcp:a:expire_tokens", {}), ("mcp:a:leak", {})]
    file = contract(tmp_path / "c.toml", [server("a", oauth.a, CODE)], steps, ("mcp:a:leak", "redacted"))
    login = truss(home, "--verbose", "--json", "mcp", "login", "a", "--contract", str(file))
    run = truss(home, "--verbose", "--json", "run", str(file))
    out = ran(run)
    assert out["status"] == "pass"
    bundle = tmp_path / "bundle.json"
    exported = truss(home, "ledger", "export", out["session"], "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr
    status = truss(home, "--verbose", "--json", "mcp", "auth", "status")
    seen = {token for tokens in oauth.admin("seen").values() for token in tokens}
    assert any(t.startswith("canary-at-") for t in seen)
    texts = [login.stdout, login.stderr, run.stdout, run.stderr, status.stdout, status.stderr, bundle.read_text()]
    for path in home.rglob("*"):
        if path.is_file():
            texts.append(path.read_bytes().decode("latin-1"))
    for text in texts:
        assert "canary-at-" not in text and "canary-rt-" not in text
    index = home / "oauth" / "index.json"
    assert stat.S_IMODE(index.stat().st_mode) == 0o600


def test_probe_url_reports_an_oauth_servers_metadata_without_a_login(oauth: Servers, home: Path) -> None:
    done = truss(home, "--json", "mcp", "probe", "--url", oauth.a)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert found["needs"] == "oauth" and found["oauth"]["resource"] == oauth.a
    authz = found["oauth"]["authorization_server"]
    assert authz["issuer"].rstrip("/") == oauth.issuer and "authorization_code" in authz["grant_types_supported"]
    assert authz["dynamic_registration"] is True
    assert oauth.admin("log") == []  # no token was asked for


# -- per call -------------------------------------------------------------------------------------


class _CountingStore(TokenStore):
    """A file token store that counts its reads and writes."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, backend="file")
        self.touched = 0

    def find(self, resource: str, issuer: str | None = None, client_id: str | None = None) -> Grant | None:
        self.touched += 1
        return super().find(resource, issuer, client_id)

    def save(self, grant: Grant) -> None:
        self.touched += 1
        super().save(grant)


@pytest.mark.anyio
async def test_calls_with_a_cached_token_send_it_from_memory_and_never_touch_the_store(
    oauth: Servers, tmp_path: Path
) -> None:
    store = _CountingStore(tmp_path / "oauth")
    flows = OAuthFlows(store, SystemClock(), environ=CC_ENV)
    data = {"contract": {"name": "per-call", "intent": "calls"}, "mcp": {"servers": [server("a", oauth.a, CC)]}}
    contract = Contract.model_validate(data)
    with anyio.fail_after(60):
        async with connect(contract, log_dir=tmp_path / "logs", clock=SystemClock(), environ=CC_ENV, auth=flows) as m:
            at_connect = store.touched
            answers = [await m.call(m.tools["mcp:a:whoami"], {}, timeout_s=20) for _ in range(5)]
            during_calls = store.touched - at_connect
    assert at_connect > 0 and during_calls == 0
    assert all(answer.text.startswith("cc-client") for answer in answers)
    assert [entry["grant"] for entry in oauth.admin("log")] == ["client_credentials"]  # one token, five calls
