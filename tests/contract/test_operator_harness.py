"""The operator's ``[harness]`` read without a contract (``ledger sweep``'s ``keep``) takes a config
that also names the ledger (``[harness] db``), as a run's loading of the same table does: ``db``
is where the record goes, read on its own, and no unknown key of ``[harness]``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import REPO, truss_cmd
from tests.durability.support import make_home
from truss.contract import harness_from_text, keep_ms
from truss.contract.harness_db import operator_db_from_text
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.testing import ManualClock


def _truss(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*truss_cmd(), "--home", str(home), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_ledger_sweep_reads_keep_from_a_config_that_names_its_ledger(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    (home / "config.toml").write_text('[harness]\ndb = "elsewhere.db"\nkeep = "90d"\n', encoding="utf-8")
    key = IdentityKey.load(home / "identity.key")
    open_store(str(home / "elsewhere.db"), key=key, clock=ManualClock(), create=True).close()
    swept = _truss(home, "--json", "ledger", "sweep", "--dry-run")
    assert swept.returncode == 0, swept.stderr
    report = json.loads(swept.stdout)
    assert report["dry_run"] is True and report["swept"] == []
    assert not (home / "ledger.db").exists()  # it swept the ledger the config names


def test_the_harness_table_without_a_contract_leaves_db_to_its_own_reader() -> None:
    harness = harness_from_text('[harness]\ndb = "postgresql://truss@db/truss"\nkeep = "1d"\n', file="config.toml")
    assert keep_ms(harness) == 86_400_000


def test_a_db_url_with_ordinary_libpq_parameters_is_taken_as_written(tmp_path: Path) -> None:
    url = (
        "postgresql://truss@db.internal/truss?sslmode=verify-full&application_name=truss&service=ledger"
        "&passfile=/etc/truss/pgpass&connect_timeout=5&sslkey=/etc/truss/client.key"
    )
    text = f'[harness]\ndb = "{url}"\n'
    assert operator_db_from_text(text, file="config.toml", home=tmp_path) == url


def test_a_libpq_key_value_db_in_the_config_is_refused_without_echoing_its_password(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    config = '[harness]\ndb = "host=db.internal dbname=truss password=canary-pw-7731"\n'
    (home / "config.toml").write_text(config, encoding="utf-8")
    before = sorted(p.name for p in home.iterdir())
    listed = _truss(home, "ledger", "list")
    assert listed.returncode == 2, listed.stderr
    assert "key=value connection string" in listed.stderr and "config.toml" in listed.stderr
    assert "canary-pw-7731" not in listed.stderr + listed.stdout
    assert "Traceback" not in listed.stderr
    assert sorted(p.name for p in home.iterdir()) == before  # no file named after the string


def test_a_libpq_key_value_db_on_the_command_line_is_refused_without_echoing_its_password(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    before = sorted(p.name for p in home.iterdir())
    listed = _truss(home, "--db", "host=db.internal password=canary-pw-7731", "ledger", "list")
    assert listed.returncode == 2, listed.stderr
    assert "key=value connection string" in listed.stderr
    assert "canary-pw-7731" not in listed.stderr + listed.stdout
    assert sorted(p.name for p in home.iterdir()) == before
    assert not list(Path(REPO).glob("host=*"))


def test_a_sqlite_path_with_an_equals_sign_is_still_a_path(tmp_path: Path) -> None:
    text = '[harness]\ndb = "runs/mode=test.db"\n'
    assert operator_db_from_text(text, file="config.toml", home=tmp_path) == str(tmp_path / "runs/mode=test.db")
