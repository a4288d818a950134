"""Attack surface: a credential written into a URL that Truss keeps (``user:password@``,
``?access_token=``, ``?key=``, ``#access_token=``...). A server's URL and args are recorded in
``session_started`` and exported; a ledger or telemetry URL is shown in messages and kept in config
files and shell history; a model provider's ``base_url`` (the agent's, a reviewer's) is recorded
like a server's URL. Every place that takes such a URL applies the one rule of
``truss._credentials`` (docs/security.md), so every attack below is tried at every place: the URL is
refused (or, for ``mcp import``, the password moved to its client's variable), the error names the
part but never the value, and nothing is written.

The attacks are data files in ``data/urls/``, one per attack, each a scheme-relative URL
(``//app:CANARY@host/db``) that every place completes with its own scheme; ``ordinary_urls.json``
holds the URLs that hold no credential and must still be taken.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.durability.support import cli
from tests.security._support import DATA
from truss import ContractError, UsageError
from truss._credentials import display_url
from truss._errors import TrussError
from truss.contract import load_contract_text, telemetry_from_text
from truss.contract.harness_db import operator_db_from_text
from truss.ledger.stores import redact_url
from truss.mcp._claude_import import convert, render_toml
from truss.telemetry.settings import resolve_settings

ATTACKS = sorted(p for p in (DATA / "urls").glob("*.json") if p.name != "ordinary_urls.json")
CONTRACTS = sorted((DATA / "contracts").glob("*_server_url*.toml"))
BASE_URL_CONTRACTS = sorted((DATA / "contracts").glob("*_base_url*.toml"))
ORDINARY: dict[str, list[str]] = {
    k: v for k, v in json.loads((DATA / "urls" / "ordinary_urls.json").read_text()).items() if k != "what"
}


def _attack(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _urls(schemes: tuple[str, ...]) -> list[Any]:
    """``(attack, URL)`` params: each attack completed with each of ``schemes`` it applies to."""
    out: list[Any] = []
    for path in ATTACKS:
        attack = _attack(path)
        for scheme in schemes:
            if scheme in attack.get("schemes", ["https", "postgresql"]):
                out.append(pytest.param(f"{scheme}:{attack['url']}", id=f"{path.stem}-{scheme}"))
    return out


def _server(body: str) -> str:
    return f'[contract]\nname = "c"\nintent = "x"\n[[mcp.servers]]\nname = "s"\n{body}allow_tools = ["t"]\n'


def _http_server(url: str) -> str:
    return _server(f'transport = "http"\nurl = {json.dumps(url)}\n')


def _agent(url: str) -> str:
    head = '[contract]\nname = "c"\nintent = "x"\n'
    return f'{head}[agent]\nprovider = "openai"\nmodel = "m"\nbase_url = {json.dumps(url)}\n'


def _reviewer(url: str) -> str:
    head = '[contract]\nname = "c"\nintent = "x"\n[[done.checks]]\nkind = "panel"\nquorum = 1\n'
    return f'{head}[[done.checks.reviewers]]\nprovider = "openai"\nmodel = "m"\nbase_url = {json.dumps(url)}\n'


def _refused(kind: type[TrussError], call: Callable[[], object]) -> TrussError:
    with pytest.raises(kind) as caught:
        call()
    error = caught.value
    assert "CANARY" not in error.diagnostics() + str(error)
    return error


def test_every_url_attack_file_is_exercised() -> None:
    assert [p.stem for p in ATTACKS] == [
        "access_token_in_the_fragment",
        "key_in_the_query",
        "password_behind_a_question_mark_in_user_info",
        "password_in_user_info",
        "password_with_an_at_sign_in_user_info",
        "password_without_a_user_name",
        "percent_encoded_password_parameter_name",
        "presigned_signature_in_the_query",
        "sslpassword_in_the_query",
        "token_as_the_user_name_of_an_http_url",
        "token_in_the_query",
    ]
    assert [p.name for p in CONTRACTS] == [
        "key_in_server_url_query.toml",
        "token_in_server_url_query.toml",
        "user_info_in_server_url.toml",
    ]
    assert [p.name for p in BASE_URL_CONTRACTS] == [
        "key_in_agent_base_url_query.toml",
        "key_in_reviewer_base_url_query.toml",
        "user_info_in_agent_base_url.toml",
    ]


# Each attack file, and the part of the contract its error must name (never the value).
_CHECKED = [(p, "mcp.servers[0].url") for p in CONTRACTS] + [(p, "base_url") for p in BASE_URL_CONTRACTS]


@pytest.mark.parametrize(("contract", "part"), _CHECKED, ids=[p.stem for p, _ in _CHECKED])
def test_a_credential_in_a_server_url_or_a_base_url_is_refused_by_contract_check_without_echoing_it(
    tmp_path: Path, contract: Path, part: str
) -> None:
    home = tmp_path / "home"
    checked = cli(home, "contract", "check", str(contract))
    assert checked.returncode == 2
    assert part in checked.stderr and "holds a credential" in checked.stderr
    assert "CANARY" not in checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    assert not home.exists()


@pytest.mark.parametrize("url", _urls(("https",)))
def test_a_credential_in_a_server_url_is_refused_at_load(url: str) -> None:
    error = _refused(ContractError, lambda: load_contract_text(_http_server(url), source="c.toml"))
    assert "url" in str(error.fields.get("path"))


@pytest.mark.parametrize("url", _urls(("https",)))
def test_a_credential_in_an_agents_or_reviewers_base_url_is_refused_at_load(url: str) -> None:
    error = _refused(ContractError, lambda: load_contract_text(_agent(url), source="c.toml"))
    assert error.fields.get("path") == "agent.base_url"
    error = _refused(ContractError, lambda: load_contract_text(_reviewer(url), source="c.toml"))
    assert error.fields.get("path") == "done.checks[0].reviewers[0].base_url"


@pytest.mark.parametrize("url", _urls(("https", "postgresql")))
def test_a_credential_in_a_url_in_stdio_args_is_refused_at_load(url: str) -> None:
    args = json.dumps(["--connect", f"{url} --verbose"])
    error = _refused(ContractError, lambda: load_contract_text(_server(f'command = "c"\nargs = {args}\n'), source="c"))
    assert "args" in str(error.fields.get("path"))


@pytest.mark.parametrize("url", _urls(("https",)))
def test_a_credential_in_the_telemetry_endpoint_is_refused(tmp_path: Path, url: str) -> None:
    _refused(ContractError, lambda: telemetry_from_text(f"[telemetry]\notlp_endpoint = {json.dumps(url)}\n", file="c"))
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": url}
    error = _refused(UsageError, lambda: resolve_settings(None, environ, check_extra=False))
    assert error.fields["env"] == "OTEL_EXPORTER_OTLP_ENDPOINT"


@pytest.mark.parametrize("url", _urls(("postgresql",)))
def test_a_credential_in_the_operator_configs_ledger_url_is_refused(tmp_path: Path, url: str) -> None:
    text = f"[harness]\ndb = {json.dumps(url)}\n"
    error = _refused(ContractError, lambda: operator_db_from_text(text, file="config.toml", home=tmp_path))
    assert error.fields["file"] == "config.toml"


@pytest.mark.parametrize("url", _urls(("postgresql",)))
def test_a_credential_in_the_db_flag_is_refused_before_any_connection(tmp_path: Path, url: str) -> None:
    done = cli(tmp_path / "home", "--db", url, "sessions")
    assert done.returncode == 2, done.stdout
    assert "CANARY" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", _urls(("https",)))
def test_mcp_import_refuses_a_credential_in_an_http_servers_url(url: str) -> None:
    error = _refused(ContractError, lambda: convert({"mcpServers": {"s": {"url": url}}}, source="f.json"))
    assert [p for p in error.fields["problems"] if p.startswith("mcpServers.s.url")]


@pytest.mark.parametrize("url", _urls(("https", "postgresql")))
def test_mcp_import_never_copies_a_credential_in_a_url_in_stdio_args(url: str) -> None:
    config = {"mcpServers": {"s": {"command": "c", "args": ["--connect", url]}}}
    try:
        written = render_toml(convert(config, source="f.json"), source="f.json")
    except ContractError as exc:  # refused, naming the arg
        written = exc.diagnostics()
        assert [p for p in exc.fields["problems"] if p.startswith("mcpServers.s.args[1]")]
    else:  # a lone password with a known client variable is moved out of the URL into it
        assert tomllib.loads(written)["mcp"]["servers"][0]["secret_env"] == ["PGPASSWORD"]
    assert "CANARY" not in written


@pytest.mark.parametrize("url", _urls(("https", "postgresql")))
def test_a_url_in_a_message_shows_no_credential(url: str) -> None:
    for shown in (redact_url(url), display_url(url)):
        assert "CANARY" not in shown
        assert shown.startswith(url.partition("//")[0] + "//")


@pytest.mark.parametrize("scheme", sorted(ORDINARY))
def test_urls_without_credentials_are_still_taken_everywhere(tmp_path: Path, scheme: str) -> None:
    for tail in ORDINARY[scheme]:
        url = f"{scheme}:{tail}"
        args = json.dumps(["--connect", url])
        contract = load_contract_text(_server(f'command = "c"\nargs = {args}\n'), source="c.toml", environ={})
        assert contract.mcp.servers[0].args[1] == url
        assert redact_url(url) == url
        imported = convert({"mcpServers": {"s": {"command": "c", "args": [url]}}}, source="f.json")
        assert imported[0].table["args"] == [url]
        if scheme == "https":
            assert load_contract_text(_http_server(url), source="c.toml").mcp.servers[0].url == url
            assert load_contract_text(_agent(url), source="c.toml").agent.base_url == url
            reviewers = load_contract_text(_reviewer(url), source="c.toml").done.checks[0].reviewers
            assert reviewers is not None and reviewers[0].base_url == url
            assert display_url(url) == re.split(r"[?#]", url, maxsplit=1)[0]  # errors leave out query and fragment
            telemetry = telemetry_from_text(f"[telemetry]\notlp_endpoint = {json.dumps(url)}\n", file="c")
            assert telemetry is not None and telemetry.otlp_endpoint == url
            assert resolve_settings(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": url}, check_extra=False) is not None
            assert convert({"mcpServers": {"s": {"url": url}}}, source="f.json")[0].table["url"] == url
        else:
            assert operator_db_from_text(f"[harness]\ndb = {json.dumps(url)}\n", file="c", home=tmp_path) == url


def test_a_url_with_ordinary_query_parameters_still_loads(tmp_path: Path) -> None:
    text = (DATA / "contracts" / "token_in_server_url_query.toml").read_text()
    contract = tmp_path / "fine.toml"
    contract.write_text(text.replace("&access_token=CANARY-url-secret-1", "&region=eu"))
    assert cli(tmp_path / "home", "contract", "check", str(contract)).returncode == 0
