"""The OAuth token store and the ``[mcp.servers.oauth]`` table, without any server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from truss._errors import InputError
from truss.contract import Contract
from truss.mcp.oauth import Grant, TokenStore
from truss.redaction import scrub_secrets


def grant(resource: str, token: str, *, issuer: str = "https://as.example", client: str | None = None) -> Grant:
    tokens = {"access_token": token, "refresh_token": token + "-refresh", "token_type": "Bearer"}
    return Grant(issuer=issuer, resource=resource, server="s", grant="authorization_code", client_id=client,
                 scopes=["read"], expires_at_ms=10, obtained_at_ms=1, tokens=tokens)  # fmt: skip


def test_the_file_store_keeps_tokens_encrypted_and_private_keyed_by_issuer_and_resource(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "oauth", backend="file")
    store.save(grant("https://a.example/mcp", "token-for-a-0123"))
    store.save(grant("https://b.example/mcp", "token-for-b-4567"))
    for path in (tmp_path / "oauth").iterdir():
        assert path.stat().st_mode & 0o077 == 0
        assert b"token-for-" not in path.read_bytes()
    found = store.find("https://a.example/mcp")
    assert found is not None and found.tokens["access_token"] == "token-for-a-0123"
    assert store.find("https://a.example/mcp", "https://other.example") is None
    assert store.find("https://c.example/mcp") is None
    facts = store.facts()
    assert [f["resource"] for f in facts] == ["https://a.example/mcp", "https://b.example/mcp"]
    assert "token-for" not in json.dumps(facts)
    assert store.delete("https://a.example/mcp") and store.find("https://a.example/mcp") is None


def test_a_stored_token_is_registered_with_the_redactor_when_it_is_read(tmp_path: Path) -> None:
    TokenStore(tmp_path / "oauth", backend="file").save(grant("https://a.example/mcp", "tok-read-back-89ab"))
    TokenStore(tmp_path / "oauth", backend="file").find("https://a.example/mcp")
    assert scrub_secrets("echo tok-read-back-89ab-refresh") == "echo [redacted]"


def test_two_clients_of_one_server_keep_separate_grants(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "oauth", backend="file")
    store.save(grant("https://a.example/mcp", "token-of-one-0000", client="one"))
    store.save(grant("https://a.example/mcp", "token-of-two-1111", client="two"))
    one, two = store.find("https://a.example/mcp", None, "one"), store.find("https://a.example/mcp", None, "two")
    assert one is not None and two is not None
    assert (one.tokens["access_token"], two.tokens["access_token"]) == ("token-of-one-0000", "token-of-two-1111")


def test_a_tampered_token_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "oauth", backend="file")
    store.save(grant("https://a.example/mcp", "token-tampered-22"))
    sealed = tmp_path / "oauth" / "tokens.enc"
    data = bytearray(sealed.read_bytes())
    data[-1] ^= 1
    sealed.write_bytes(bytes(data))
    with pytest.raises(InputError, match="does not decrypt"):
        store.find("https://a.example/mcp")


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "oauth", backend="file")
    store.save(grant("https://a.example/mcp", "token-readable-33"))
    (tmp_path / "oauth" / "tokens.enc").chmod(0o644)
    with pytest.raises(InputError, match="readable by other users"):
        store.find("https://a.example/mcp")


def _server(**oauth: Any) -> dict[str, Any]:
    return {"name": "s", "transport": "http", "url": "https://mcp.example/mcp", "allow_tools": ["*"], "oauth": oauth}


def _load(server: dict[str, Any]) -> Contract:
    return Contract.model_validate({"contract": {"name": "t", "intent": "t"}, "mcp": {"servers": [server]}})


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ({**_server(), "headers": {"Authorization": {"secret_env": "TOKEN"}}}, "remove the static Authorization"),
        (_server(grant="client_credentials", client_id="c"), "needs client_secret_env"),
        (_server(grant="client_credentials", client_secret_env="S"), "needs a client_id"),
        (_server(grant="private_key_jwt", client_id="c"), "needs private_key_file"),
        (_server(client_metadata_url="http://not-https.example/doc"), "must be an https URL"),
        (_server(scopes=["has space"]), "is not an OAuth scope token"),
        ({"name": "s", "command": "x", "allow_tools": ["*"], "oauth": {}}, "belong to http servers"),
    ],
)
def test_an_oauth_table_that_cannot_work_is_refused_at_load(server: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        _load(server)


def test_a_valid_oauth_table_names_its_secrets_and_never_holds_them() -> None:
    contract = _load(_server(grant="client_credentials", client_id="c", client_secret_env="CLIENT_SECRET"))
    oauth = contract.to_json()["mcp"]["servers"][0]["oauth"]
    assert oauth["client_secret_env"] == "CLIENT_SECRET"


_SAVER = """
import sys
from pathlib import Path
from truss.mcp.oauth import Grant, TokenStore
store = TokenStore(Path(sys.argv[1]), backend="file")
for i in range(int(sys.argv[3])):
    resource = f"https://{sys.argv[2]}-{i}.example/mcp"
    tokens = {"access_token": f"tok-{sys.argv[2]}-{i}-abcdef", "token_type": "Bearer"}
    store.save(Grant(issuer="https://as.example", resource=resource, server="s", grant="client_credentials",
                     obtained_at_ms=1, tokens=tokens))
"""


def test_logins_in_several_processes_at_once_lose_no_grant(tmp_path: Path) -> None:
    import subprocess
    import sys

    directory, writers, each = tmp_path / "oauth", 6, 15
    procs = [
        subprocess.Popen([sys.executable, "-c", _SAVER, str(directory), f"w{n}", str(each)]) for n in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    store = TokenStore(directory, backend="file")
    assert len(store.facts()) == writers * each
    for n in range(writers):
        for i in range(each):
            found = store.find(f"https://w{n}-{i}.example/mcp")
            assert found is not None and found.tokens["access_token"] == f"tok-w{n}-{i}-abcdef"
