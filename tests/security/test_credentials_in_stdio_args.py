"""Attack surface: a password written into a stdio server's ``args``
(``postgresql://app:s3cret@127.0.0.1/shop``, ``--api-key=...``, ``--password s3cret``). The
effective contract is recorded in ``session_started`` and exported, so the credential would be in
the ledger for good: ``contract check``, ``run`` and ``mcp import`` accepted it. It is refused at
load now, as credentials in URLs are, naming ``secret_env`` as the remedy and never echoing the
value; ``mcp import`` takes a URL's password out and suggests its client's variable instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.durability.support import cli
from tests.gate.support import files_containing
from tests.security._support import DATA
from truss.contract import load_contract_text

ATTACKS = sorted((DATA / "contracts").glob("*_in_stdio_args.toml"))


def test_every_stdio_args_attack_file_is_exercised() -> None:
    assert [p.name for p in ATTACKS] == [
        "api_key_option_in_stdio_args.toml",
        "password_and_token_query_in_stdio_args.toml",
        "password_flag_in_stdio_args.toml",
        "password_in_stdio_args.toml",
    ]


@pytest.mark.parametrize("contract", ATTACKS, ids=[p.stem for p in ATTACKS])
def test_a_credential_in_stdio_args_is_refused_by_contract_check_naming_secret_env(
    tmp_path: Path, contract: Path
) -> None:
    home = tmp_path / "home"
    checked = cli(home, "contract", "check", str(contract))
    assert checked.returncode == 2, checked.stdout
    assert "mcp.servers[0].args[" in checked.stderr and "holds a credential" in checked.stderr
    assert "secret_env" in checked.stderr
    assert "CANARY" not in checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr


def test_the_rewrite_suggested_for_an_arg_with_several_credentials_holds_none_of_them(tmp_path: Path) -> None:
    contract = DATA / "contracts" / "password_and_token_query_in_stdio_args.toml"
    checked = cli(tmp_path / "home", "contract", "check", str(contract))
    assert checked.returncode == 2, checked.stdout
    assert "write args[2] as 'postgresql://app@127.0.0.1/shop'" in checked.stderr
    assert "CANARY" not in checked.stdout + checked.stderr


def test_a_password_in_stdio_args_is_refused_by_run_and_nothing_is_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = cli(home, "run", str(DATA / "contracts" / "password_in_stdio_args.toml"))
    assert done.returncode == 2
    assert "PGPASSWORD" in done.stderr and "CANARY" not in done.stdout + done.stderr
    assert files_containing(tmp_path, b"CANARY-args-secret-3") == []


@pytest.mark.parametrize(
    "args",
    [
        ["-y", "@modelcontextprotocol/server-postgres", "postgresql://app@127.0.0.1/shop"],
        ["--token-file", "/run/secrets/token"],
        ["--tokens", "/etc/truss/tokens"],
        ["https://example.test/api?region=eu", "--bypass=yes", "git@github.com:a/b.git"],
    ],
)
def test_ordinary_stdio_args_still_load(args: list[str]) -> None:
    server = f'name = "s"\ncommand = "c"\nargs = {json.dumps(args)}\nallow_tools = ["t"]\n'
    text = f'[contract]\nname = "ok"\nintent = "x"\n[[mcp.servers]]\n{server}'
    assert load_contract_text(text, source="ok.toml", environ={}).mcp.servers[0].args == args


def test_mcp_import_turns_a_password_in_a_url_arg_into_a_secret_env_suggestion(tmp_path: Path) -> None:
    out = tmp_path / "imported.toml"
    done = cli(
        tmp_path / "home", "mcp", "import", str(DATA / "imports" / "password_in_stdio_args.json"), "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    written = out.read_text(encoding="utf-8")
    assert "CANARY" not in written + done.stdout + done.stderr
    contract = load_contract_text(written.replace("allow_tools = []", 'allow_tools = ["query"]'), source="i.toml",
                                  environ={})  # fmt: skip
    [server] = contract.mcp.servers
    assert server.args[-1] == "postgresql://app@127.0.0.1/shop"
    assert server.secret_env == ["PGPASSWORD"]
    assert "PGPASSWORD" in written  # the note tells the operator what to export


def test_mcp_import_refuses_an_arg_with_a_password_and_a_token_rather_than_drop_the_token(tmp_path: Path) -> None:
    # Moving the password into PGPASSWORD and writing the URL without the token would lose the
    # token without a word; both are named and nothing is written.
    out = tmp_path / "imported.toml"
    source = DATA / "imports" / "password_and_token_query_in_stdio_args.json"
    done = cli(tmp_path / "home", "mcp", "import", str(source), "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert "args[2]" in done.stderr and "user info" in done.stderr and "'token'" in done.stderr
    assert "CANARY" not in done.stdout + done.stderr
    assert not out.exists()


def test_mcp_import_refuses_an_api_key_option_in_args_naming_secret_env(tmp_path: Path) -> None:
    out = tmp_path / "imported.toml"
    done = cli(tmp_path / "home", "mcp", "import", str(DATA / "imports" / "api_key_option_in_stdio_args.json"),
               "-o", str(out))  # fmt: skip
    assert done.returncode == 2
    assert "args[0]" in done.stderr and "secret_env" in done.stderr
    assert "CANARY" not in done.stdout + done.stderr
    assert not out.exists()


FOLDS = {
    "two_passwords_for_one_variable_in_one_server.json": ("mcpServers.postgres.args[2]", "mcpServers.postgres.args[3]"),
    "two_passwords_for_one_variable_in_two_servers.json": ("mcpServers.shop.args[2]", "mcpServers.stats.args[2]"),
    "password_in_a_url_beside_its_variable_passed_through.json": (
        "mcpServers.postgres.args[2]",
        "mcpServers.postgres.env.PGPASSWORD",
    ),
}


def test_every_import_attack_file_is_exercised() -> None:
    tried = {"api_key_option_in_stdio_args.json", "password_and_token_query_in_stdio_args.json"}
    tried |= {"password_in_stdio_args.json", *FOLDS}
    assert sorted(p.name for p in (DATA / "imports").glob("*.json")) == sorted(tried)


@pytest.mark.parametrize("source", sorted(FOLDS), ids=[Path(n).stem for n in sorted(FOLDS)])
def test_mcp_import_refuses_two_credentials_for_one_variable_naming_both_places(tmp_path: Path, source: str) -> None:
    # Truss passes one PGPASSWORD: keeping one of two different passwords would lose the other silently.
    out = tmp_path / "imported.toml"
    done = cli(tmp_path / "home", "--json", "mcp", "import", str(DATA / "imports" / source), "-o", str(out))
    assert done.returncode == 2, done.stdout
    assert "CANARY" not in done.stdout + done.stderr
    [problem] = json.loads(done.stdout)["problems"]
    first, second = FOLDS[source]
    assert first in problem and second in problem and "PGPASSWORD" in problem
    assert not out.exists()
