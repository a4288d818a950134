"""What a ``postgresql://`` URL for ``--db`` may say, and how Truss splits it for libpq.

Truss's own parameters (``schema``, ``checkpoint_interval``) are taken out; the rest goes to
libpq unchanged, so everything libpq accepts works (``host=/run/postgresql`` for a socket,
``service=``, ``sslmode=``...). A credential is refused in the URL by the rule that refuses one in
a contract's server URLs (``truss._credentials``: a password in the user info, libpq's
``password`` or ``sslpassword`` or any credential-named query parameter): it would be recorded in
shell history, config files and error messages. It comes from ``PGPASSWORD``, a passfile or a
service file instead. Errors show the URL without its query and never echo a credential.

This module does no I/O and does not import psycopg.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from truss._clock import parse_duration_ms
from truss._credentials import UNPARSABLE_URL, redact_url, url_credentials
from truss._errors import UsageError

__all__ = ["DEFAULT_CHECKPOINT_INTERVAL_MS", "DEFAULT_SCHEMA", "PostgresTarget", "parse_postgres_url"]

DEFAULT_CHECKPOINT_INTERVAL_MS = 1000
DEFAULT_SCHEMA = "truss"
_SCHEMES = ("postgresql", "postgres")
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class PostgresTarget:
    """What a ``postgresql://`` URL names, once Truss's own parameters are taken out of it."""

    conninfo: str  # the URL libpq gets (no Truss parameters; never a password)
    schema: str
    checkpoint_interval_ms: int
    shown: str  # the URL as messages show it


def _usage(url: str, problem: str, remedy: str) -> UsageError:
    return UsageError(f"--db {url!r}: {problem}", remedy=remedy, what="db")


def parse_postgres_url(url: str) -> PostgresTarget:
    """Split a ``postgresql://`` URL into libpq's part and Truss's settings; refuse a literal password.

    Raises ``UsageError`` (exit 2) naming the problem, never echoing a credential.
    """
    shown = urlunsplit(urlsplit(redact_url(url))._replace(query="", fragment=""))
    problems = url_credentials(url)
    if problems[:1] == [UNPARSABLE_URL]:
        raise _usage(shown, "not a URL Truss can parse", "write postgresql://[USER@]HOST[:PORT]/DATABASE")
    parts = urlsplit(url)
    if parts.scheme.lower() not in _SCHEMES:
        raise _usage(shown, "not a postgresql:// URL", "write postgresql://[USER@]HOST[:PORT]/DATABASE")
    if problems:
        raise _usage(
            shown,
            f"the URL holds a credential ({'; '.join(problems)})",
            "give the password through PGPASSWORD, a passfile (~/.pgpass or PGPASSFILE) or a libpq service "
            "file, never in --db, TRUSS_DB or a config file",
        )
    schema, interval = DEFAULT_SCHEMA, DEFAULT_CHECKPOINT_INTERVAL_MS
    kept: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "schema":
            if not _IDENTIFIER.fullmatch(value):
                raise _usage(url, f"schema {value!r} is not a lower-case SQL identifier", "use [a-z_][a-z0-9_]*")
            schema = value
        elif name == "checkpoint_interval":
            interval = _interval_ms(url, value)
        else:
            kept.append((name, value))
    if not any(name == "application_name" for name, _ in kept):
        kept.append(("application_name", "truss"))
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))
    return PostgresTarget(conninfo=conninfo, schema=schema, checkpoint_interval_ms=interval, shown=shown)


def _interval_ms(url: str, value: str) -> int:
    if value.strip() in {"0", "0ms", "0s"}:
        return 0
    try:
        return parse_duration_ms(value)
    except ValueError:
        raise _usage(url, f"checkpoint_interval {value!r} is not a duration", "write e.g. 1s or 250ms") from None
