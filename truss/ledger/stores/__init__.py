"""Ledger stores: one protocol, one backend per module, one registry keyed by URL scheme.

``open_store(url_or_path, key=..., clock=...)`` is how everything outside this package gets a
store (the CLI's ``--db``, serve-mcp, an embedding program). What it opens depends on the scheme:

=====================  ==========================================================================
``PATH`` (no scheme)   the SQLite store at that file (the embedded default)
``sqlite:///ABS/PATH``  the same, as a URL (``sqlite:REL/PATH`` for a relative path)
``memory:``            a new, empty in-memory store (nothing survives the process)
anything else          ``UsageError``, unless a backend registered that scheme
=====================  ==========================================================================

A backend is a module that implements ``LedgerStore`` (``base.py``), calls ``base.seal_batch``
inside its write transaction, passes ``truss.testing.check_ledger_store``, and registers an
opener: ``register_store("postgresql", open_postgresql)``. Schemes are case-insensitive; an
unknown one is refused, never taken for a path. The registry holds openers, not modules: the
SQLite and memory backends are imported on first use, so importing this package loads neither
sqlite3 nor PyNaCl. Error messages show a URL without its credentials (``redact_url``).
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING

from truss._conninfo import looks_like_conninfo as _looks_like_conninfo
from truss._errors import UsageError as _UsageError
from truss.ledger.stores.base import LedgerStore, SessionInfo, StoredCheckpoint, StoreOpener

if TYPE_CHECKING:
    from truss._clock import Clock
    from truss.ledger.keys import IdentityKey

__all__ = [
    "LedgerStore",
    "SessionInfo",
    "StoreOpener",
    "StoredCheckpoint",
    "open_store",
    "redact_url",
    "register_store",
    "store_scheme",
    "store_schemes",
    "unregister_store",
]

# RFC 3986 section 3.1; one letter is a drive (C:\...) on other systems, so it counts as a path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def _open_sqlite(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> LedgerStore:
    from truss.ledger.stores.sqlite import open_sqlite

    return open_sqlite(url, key=key, clock=clock, create=create)


def _open_memory(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> LedgerStore:
    from truss.ledger.stores.memory import open_memory

    return open_memory(url, key=key, clock=clock, create=create)


def _open_postgresql(url: str, /, *, key: IdentityKey | None, clock: Clock, create: bool) -> LedgerStore:
    from truss.ledger.stores._pg_url import parse_postgres_url

    parse_postgres_url(url)  # a credential in the URL is refused whether or not psycopg is installed
    try:
        from truss.ledger.stores.postgresql import open_postgresql
    except ImportError as exc:  # the optional extra is not installed
        raise _UsageError(
            f"--db {redact_url(url).split('?', 1)[0]!r}: the PostgreSQL store needs psycopg, which is not installed",
            remedy="pip install 'truss[postgres]' (docs/postgresql.md)",
            what="db",
            missing=exc.name,
        ) from exc
    return open_postgresql(url, key=key, clock=clock, create=create)


_BUILT_IN: dict[str, StoreOpener] = {
    "sqlite": _open_sqlite,
    "memory": _open_memory,
    "postgresql": _open_postgresql,
    "postgres": _open_postgresql,
}
_registry: dict[str, StoreOpener] = dict(_BUILT_IN)
_lock = threading.Lock()


def store_scheme(url: str | os.PathLike[str]) -> str:
    """The scheme ``url`` selects: ``sqlite`` for a path, else its lower-cased URL scheme."""
    if isinstance(url, os.PathLike):
        return "sqlite"
    found = _SCHEME.match(url)
    return found.group(1).lower() if found else "sqlite"


def redact_url(url: str | os.PathLike[str]) -> str:
    """``url`` as it may appear in a message: each credential in it (a password, a credential query
    parameter's value: the rule of ``truss._credentials``) replaced by ``***``; a path as it is."""
    from truss._credentials import redact_url as redact  # its patterns compile at import: only when an error needs them

    return redact(os.fspath(url))


def register_store(scheme: str, opener: StoreOpener, *, replace: bool = False) -> None:
    """Make ``open_store`` open URLs of ``scheme`` with ``opener`` (refuses a taken scheme unless ``replace``)."""
    name = scheme.lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.-]+", name):
        raise _UsageError(f"{scheme!r} is not a URL scheme", remedy="use letters, digits, '+', '-' or '.'")
    with _lock:
        if name in _registry and not replace:
            raise _UsageError(f"the store scheme {name!r} is already registered", remedy="pass replace=True")
        _registry[name] = opener


def unregister_store(scheme: str) -> None:
    """Forget a registered scheme (the built-in ones come back as they were)."""
    name = scheme.lower()
    with _lock:
        if name in _BUILT_IN:
            _registry[name] = _BUILT_IN[name]
        else:
            _registry.pop(name, None)


def store_schemes() -> list[str]:
    """The schemes ``open_store`` accepts, sorted."""
    with _lock:
        return sorted(_registry)


def open_store(
    url: str | os.PathLike[str], *, key: IdentityKey | None, clock: Clock, create: bool = True
) -> LedgerStore:
    """Open the ledger store ``url`` names (see the module docstring for the forms).

    ``key`` signs appended entries (without one the store is read-only); ``create=False`` refuses
    a ledger that does not exist (``NotFoundError``). An unknown scheme is a ``UsageError``.
    """
    text = os.fspath(url)
    if not text.strip():
        raise _UsageError("--db is empty", remedy="give a path, sqlite:///PATH or memory:", what="db")
    if _looks_like_conninfo(text):
        raise _UsageError(
            "--db looks like a libpq key=value connection string, which would be taken as a file name "
            "(the value is not shown: it may hold a password)",
            remedy="give a postgresql:// URL (docs/postgresql.md), its password through PGPASSWORD, a passfile "
            "or a service file",
            what="db",
        )
    scheme = store_scheme(url)
    with _lock:
        opener = _registry.get(scheme)
        known = sorted(_registry)
    if opener is None:
        raise _UsageError(
            f"--db {redact_url(text)!r}: no ledger store is registered for the scheme {scheme!r}",
            remedy=f"give a path, or a URL with one of the schemes {', '.join(f'{s}:' for s in known)}",
            what="db",
            scheme=scheme,
        )
    return opener(text, key=key, clock=clock, create=create)
