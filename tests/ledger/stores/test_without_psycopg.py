"""Truss without the ``postgres`` extra: importing it and using SQLite never needs psycopg."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HIDE_PSYCOPG = textwrap.dedent(
    """
    import importlib.abc, sys

    class HidePsycopg(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, HidePsycopg())
    """
)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE_PSYCOPG + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def test_truss_imports_and_records_on_sqlite_with_psycopg_hidden(tmp_path: Path) -> None:
    done = _run(
        """
        import sys
        from pathlib import Path
        import truss, truss.ledger, truss.testing, truss_cli.main
        from truss.ledger.entry import Record
        from truss.ledger.keys import IdentityKey
        from truss.ledger.store import open_store
        from truss.testing import ManualClock

        key = IdentityKey.from_seed(bytes(32), "nopg.truss.test")
        with open_store(Path("ledger.db"), key=key, clock=ManualClock()) as store:
            store.append("s", [Record("session_started", {"contract": "c"})])
        assert not [m for m in sys.modules if m.startswith("psycopg")], "psycopg was imported"
        print("ok")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_truss_does_not_import_psycopg_even_when_it_is_installed(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, truss, truss.ledger, truss_cli.main; print(sorted(m for m in sys.modules if 'psycopg' in m))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _pytest_without_psycopg(ci: bool) -> subprocess.CompletedProcess[str]:
    """The PostgreSQL tests run by pytest in a process where psycopg cannot be imported."""
    code = textwrap.dedent(
        """
        import sys
        import pytest

        for name in ("psycopg", "psycopg_pool"):
            sys.modules[name] = None  # import fails and importlib.util.find_spec says None, as when missing
        sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTEST_ADDOPTS"}}
    if ci:
        env["CI"] = "true"
    repo = Path(__file__).resolve().parents[3]
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "tests/ledger/stores/test_migrate.py",
            "tests/ledger/test_store_registry.py::test_every_registered_store_passes_the_conformance_check_through_open_store[postgresql]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=repo,
        env=env,
    )


def test_the_postgresql_tests_are_skipped_with_the_install_hint_without_psycopg_outside_ci() -> None:
    done = _pytest_without_psycopg(ci=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped" in done.stdout and "apt-get install postgresql" in done.stdout
    assert "passed" not in done.stdout and "failed" not in done.stdout


def test_the_postgresql_tests_fail_under_ci_when_psycopg_is_missing() -> None:
    done = _pytest_without_psycopg(ci=True)
    assert done.returncode != 0, done.stdout
    assert "skipped" not in done.stdout
    assert "apt-get install postgresql" in done.stdout
