"""Key-less tampering of a real ledger on PostgreSQL: every stored byte that changes what a command
shows is caught.

The small real ledger of the SQLite suite (tests/ledger/test_tamper_suite.py: sessions pass, fail,
denied, waiting and approved, erased) is recorded, then copied into PostgreSQL with ``truss ledger
migrate``. For each mutation the schema is copied (``CREATE TABLE ... (LIKE ... INCLUDING ALL)``
and its rows), the mutation is applied to the copy's rows, and the copy must either fail ``truss
--db URL ledger verify --all`` or leave the output of every reading command (show, export,
replay, verdict, list, sessions) byte for byte what it was on the untouched ledger.

The mutation kinds are the SQLite suite's data (``tests/ledger/tamper/mutations.json``); the
tables and columns are this schema's (``tamper/mutations.json`` here), checked against
``information_schema``. The full cross product runs, with no sampling (about a minute): each copy
is a few small tables, and the reading commands run in this process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._services.postgres import TempPostgres
from tests.durability.support import cli
from tests.ledger.test_tamper_suite import MUTATIONS as KINDS
from tests.ledger.test_tamper_suite import build_ledger, flip, fresh_key, outputs

pytestmark = [pytest.mark.slow, pytest.mark.peers]

MUTATIONS = json.loads((Path(__file__).parent / "tamper" / "mutations.json").read_text(encoding="utf-8"))
_BASE = "tamper_base"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, postgres_server: TempPostgres) -> Path:
    """The home of the small real ledger, its entries migrated into the schema ``tamper_base``."""
    home = build_ledger(tmp_path_factory.mktemp("pg-tamper"))
    url = postgres_server.url(schema=_BASE)
    migrated = cli(home, "ledger", "migrate", "--to", url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    verified = cli(home, "--db", url, "ledger", "verify", "--all")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    return home


def _columns(conn: Any, schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
        " ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    return [r[0] for r in rows]


def _tables(conn: Any, schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'"
        " ORDER BY table_name",
        (schema,),
    ).fetchall()
    return [r[0] for r in rows]


def _types(conn: Any, schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _copy(conn: Any, into: str) -> None:
    """A copy of the base ledger's schema (tables, keys, constraints, rows) named ``into``."""
    conn.execute(f"DROP SCHEMA IF EXISTS {into} CASCADE")
    conn.execute(f"CREATE SCHEMA {into}")
    for table in _tables(conn, _BASE):
        conn.execute(f"CREATE TABLE {into}.{table} (LIKE {_BASE}.{table} INCLUDING ALL)")
        conn.execute(f"INSERT INTO {into}.{table} SELECT * FROM {_BASE}.{table}")


def _mutations(conn: Any) -> Iterator[tuple[str, str]]:
    """Every (table, mutation) the data files name for the tables that hold rows."""
    present = set(_tables(conn, _BASE))
    for table, spec in MUTATIONS["tables"].items():
        if table not in present or conn.execute(f"SELECT 1 FROM {_BASE}.{table} LIMIT 1").fetchone() is None:
            continue
        for column in spec["columns"]:
            for kind in KINDS["column_kinds"]:
                yield table, f"{kind} {column}"
        for kind in KINDS["row_kinds"]:
            yield table, kind


def _pg_flip(value: Any) -> Any:
    return (not value) if isinstance(value, bool) else flip(value)


def _one(data_type: str) -> Any:
    """A value of the column's type for a NULL to become."""
    return {"bytea": b"\x01", "boolean": True, "text": "1"}.get(data_type, 1)


def _apply(conn: Any, schema: str, table: str, mutation: str) -> bool:
    """Apply one mutation to ``schema``'s copy; False when it cannot apply (nothing to change, or refused)."""
    import psycopg

    key = MUTATIONS["tables"][table]["key"]
    columns = _columns(conn, schema, table)
    types = _types(conn, schema, table)
    order = ", ".join(key)
    rows = [
        dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT * FROM {schema}.{table} ORDER BY {order}")
    ]
    values = rows[len(rows) // 2]
    where = " AND ".join(f"{k} = %s" for k in key)

    def at(row: dict[str, Any]) -> list[Any]:
        return [row[k] for k in key]

    kind, _, column = mutation.partition(" ")
    try:
        with conn.transaction():
            if kind in ("byte_flip", "value_change"):
                if values[column] is None:
                    if kind == "byte_flip":
                        return False
                    new: Any = _one(types[column])
                elif kind == "byte_flip":
                    new = _pg_flip(values[column])
                else:
                    different = [r[column] for r in rows if r[column] != values[column]]
                    new = different[0] if different else _pg_flip(values[column])
                conn.execute(f"UPDATE {schema}.{table} SET {column} = %s WHERE {where}", [new, *at(values)])
            elif kind == "row_delete":
                conn.execute(f"DELETE FROM {schema}.{table} WHERE {where}", at(values))
            elif kind in ("row_insert", "duplicate"):
                copy = dict(values)
                for name in key:  # a smallint key (tree.id, nodes.level) stays in its range
                    small = types[name] == "smallint"
                    copy[name] = copy[name] + 1000 if small else fresh_key(copy[name])
                if kind == "row_insert":  # a forged row: its own values changed too
                    for name in columns:
                        if name not in key and copy[name] is not None:
                            copy[name] = _pg_flip(copy[name])
                marks = ", ".join(["%s"] * len(columns))
                conn.execute(
                    f"INSERT INTO {schema}.{table} ({', '.join(columns)}) VALUES ({marks})", [copy[c] for c in columns]
                )
            elif kind == "row_swap":
                other = rows[0] if rows[0] is not values else rows[-1]
                payload = [c for c in columns if c not in key]
                if other is values or not payload:
                    return False
                sets = ", ".join(f"{c} = %s" for c in payload)
                update = f"UPDATE {schema}.{table} SET {sets} WHERE {where}"
                conn.execute(update, [other[c] for c in payload] + at(values))
                conn.execute(update, [values[c] for c in payload] + at(other))
            else:
                raise AssertionError(f"unknown mutation kind {kind!r} in mutations.json")
    except psycopg.errors.IntegrityError:  # a key or CHECK constraint refused it: nothing changed
        return False
    return True


def _normalised(got: dict[str, tuple[int, str]], schema: str) -> dict[str, tuple[int, str]]:
    return {name: (code, re.sub(rf"\b{schema}\b", "SCHEMA", text)) for name, (code, text) in got.items()}


def test_every_column_of_the_postgresql_schema_is_named_by_the_mutation_data(
    ledger: Path, postgres_server: TempPostgres
) -> None:
    with postgres_server.admin() as conn:
        tables = _tables(conn, _BASE)
        assert sorted(tables) == sorted(MUTATIONS["tables"]), "a table is not covered by tamper/mutations.json"
        for table in tables:
            assert sorted(_columns(conn, _BASE, table)) == sorted(MUTATIONS["tables"][table]["columns"]), (
                f"columns of {table} changed: cover each new one in tests/postgres/tamper/mutations.json"
            )


def test_every_key_less_mutation_of_the_postgresql_rows_fails_verification_or_changes_no_command_output(
    ledger: Path, postgres_server: TempPostgres
) -> None:
    base = ("--db", postgres_server.url(schema=_BASE))
    baseline = _normalised(outputs(ledger, base), _BASE)
    assert all(code in (0, 1, 2, 3) for code, _ in baseline.values()), baseline
    escaped: list[str] = []
    tried = 0
    with postgres_server.admin() as conn:
        for table, mutation in list(_mutations(conn)):
            if table in MUTATIONS["not_evidence"]:
                continue
            absent = MUTATIONS["availability"]["mutations"].get(table, [])
            if "*" in absent or mutation in absent:
                continue  # makes a payload absent, never wrong (the data file says why)
            schema = f"tamper_m{tried}"
            _copy(conn, schema)
            if not _apply(conn, schema, table, mutation):
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
                continue
            tried += 1
            db = ("--db", postgres_server.url(schema=schema))
            verify = cli(ledger, *db, "--json", "ledger", "verify", "--all")
            if verify.returncode == 0:
                got = _normalised(outputs(ledger, db), schema)
                changed = [name for name, out in got.items() if out != baseline[name]]
                if changed:
                    escaped.append(f"{table}: {mutation} passes verify --all but changes {', '.join(changed)}")
            elif verify.returncode not in (1, 2) or "internal error" in verify.stderr:
                # Refused as tampered (1) or as not a usable ledger (2), with a clear message: never a crash.
                escaped.append(f"{table}: {mutation}: verify exit {verify.returncode}: {verify.stderr.strip()[:200]}")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    assert tried > 40, f"only {tried} mutations applied"
    assert not escaped, "\n".join(escaped)
