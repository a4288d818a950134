"""``[harness] db`` in the operator config: which ledger the home's commands record into.

The operator config (``HOME/config.toml``) may name the ledger: ``[harness] db = "postgresql://..."``
or a SQLite path (relative paths are relative to the home). The precedence is ``--db`` >
``$TRUSS_DB`` > ``[harness] db`` > ``HOME/ledger.db``; the CLI resolves it (``truss_cli._ctx``).

The value is where the record goes, not what a run may do, so it is **not** part of the effective
contract: ``truss.contract.layers`` drops it before merging, and a contract's hash is the same
whichever ledger records it. It is read on its own, before any contract is loaded (``ledger
list`` and ``sessions`` need the ledger without a contract).

A password never appears in it: a credential by the rule of ``truss._credentials`` (user info
with a password, a query parameter named like a credential) is refused with the file and line
(``ContractError``, exit 2), the value not echoed. Give it through ``PGPASSWORD``, a passfile or a
libpq service file. Reads the config file only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

from truss._conninfo import looks_like_conninfo
from truss._credentials import url_credentials
from truss.contract.layers import parse_layer, read_toml_file

__all__ = ["operator_db", "operator_db_from_text"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def operator_db(home: Path | str) -> str | None:
    """``[harness] db`` of ``HOME/config.toml`` (a relative path made relative to the home); None when unset."""
    path = Path(home) / "config.toml"
    if not path.exists():
        return None
    return operator_db_from_text(read_toml_file(path, role="operator config"), file=str(path), home=Path(home))


def operator_db_from_text(text: str, *, file: str, home: Path) -> str | None:
    layer = parse_layer(text, file=file, role="operator config")
    harness: Any = layer.data.get("harness")
    if not isinstance(harness, dict) or "db" not in harness:
        return None
    value: Any = cast(dict[str, Any], harness)["db"]
    where = ("harness", "db")
    if not isinstance(value, str) or not value.strip():
        raise layer.error(
            "[harness] db is the ledger: a non-empty string (a SQLite path or a postgresql:// URL)",
            where,
            remedy='Write e.g. db = "postgresql://truss@db.internal/truss", or remove it for HOME/ledger.db',
        )
    if looks_like_conninfo(value):
        raise layer.error(
            "[harness] db looks like a libpq key=value connection string, which would be taken as a file "
            "name (the value is not shown: it may hold a password)",
            where,
            remedy='Write a URL, e.g. db = "postgresql://truss@db.internal/truss", and give the password '
            "through PGPASSWORD, a passfile or a libpq service file",
        )
    found = _SCHEME.match(value)
    if found is None or len(found.group(1)) == 1:  # a path (a Windows drive letter is not a scheme)
        return value if Path(value).is_absolute() else str(home / value)
    problems = url_credentials(value)
    if problems:
        raise layer.error(
            f"[harness] db holds a credential ({'; '.join(problems)}); a config file never holds a password",
            where,
            remedy="Remove it from the URL and give it through PGPASSWORD, a passfile (~/.pgpass or "
            "PGPASSFILE) or a libpq service file (service=NAME)",
        )
    return value
