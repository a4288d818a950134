"""Whether a ledger name is libpq's ``key=value`` connection string rather than a path or a URL.

libpq takes two forms: a URL (``postgresql://...``) and ``host=db dbname=truss password=...``.
Truss takes only the URL. Without a scheme the second form would be taken as a SQLite file name,
and a password in it would end up in a path, so both ``open_store`` (``--db``, ``TRUSS_DB``) and
``[harness] db`` refuse it, without repeating the value. Pure: no I/O.
"""

from __future__ import annotations

import re

__all__ = ["looks_like_conninfo"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
_KEYWORD = re.compile(
    r"(?:^|\s)(?:host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options)\s*=", re.IGNORECASE
)


def looks_like_conninfo(text: str) -> bool:
    """True when ``text`` has no URL scheme and holds a libpq ``keyword=`` pair."""
    return _SCHEME.match(text) is None and _KEYWORD.search(text) is not None
