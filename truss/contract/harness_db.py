"""``[harness] db`` in the operator config: which ledger the home's commands record into.

The operator config (``HOME/config.toml``) may name the ledger: ``[harness] db = "postgresql://..."``
or a SQLite path (relative paths are relative to the home). The precedence is ``--db`` >
``$TRUSS_DB`` > ``[harness] db`` > ``HOME/ledger.db``; the CLI resolves it (``truss_cli._ctx``).

The value is where the record goes, not what a run may do, so it is **not** part of the effective
contract: ``truss.contract.layers`` drops it before merging, and a contract's hash is the same
whichever ledger records it. It is read on its own, before any contract is loaded (``ledger
list`` and ``sessions`` need the ledger without a contract).

A password never appears in it: user info with a password, or a query parameter named like a
credential, is refused with the file and line (``ContractError``, exit 2), the value not echoed.
Give it through ``PGPASSWORD``, a passfile or a libpq service file. Reads the config file only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

from truss._conninfo import looks_like_conninfo
from truss.contract.fields import CREDENTIAL_ENV_RE, CREDENTIAL_HEADER_RE, CREDENTIAL_QUERY_RE
from truss.contract.layers import parse_layer, read_toml_file

__all__ = ["operator_db", "operator_db_from_text"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PASSWORD_PARAM = re.compile(r"(?i)passw(?:or)?d|passfile_contents")


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
    problem = _credential_in(value)
    if problem is not None:
        raise layer.error(
            f"[harness] db holds a credential ({problem}); a config file never holds a password",
            where,
            remedy="Remove it from the URL and give it through PGPASSWORD, a passfile (~/.pgpass or "
            "PGPASSFILE) or a libpq service file (service=NAME)",
        )
    return value


def _credential_in(url: str) -> str | None:
    parts = urlsplit(url)
    user_part, at, _ = parts.netloc.rpartition("@")
    if at and ":" in user_part:
        return "a password in the user info"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if (
            _PASSWORD_PARAM.search(name)
            or CREDENTIAL_QUERY_RE.match(name)
            or CREDENTIAL_HEADER_RE.search(name)
            or CREDENTIAL_ENV_RE.search(name)
        ):
            return f"the query parameter {name!r}"
    return None
