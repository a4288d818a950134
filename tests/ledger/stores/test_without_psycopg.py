"""Truss without the ``postgres`` extra: importing it and using SQLite never needs psycopg."""

from __future__ import annotations

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
