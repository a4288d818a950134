"""Key-less tampering of a real ledger: every stored byte that changes what a command shows is caught.

A small real ledger (runs against the counting server: a pass, a fail, a denial, a call waiting
for approval and then approved, one session's payloads erased) is copied once per mutation; the
mutation kinds and the tables and columns they apply to are data (``tamper/mutations.json``). Each
mutated copy must either fail ``truss ledger verify --all`` or leave the output of every reading
command (show, export, replay, verdict, list, sessions) byte for byte what it was.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import python_peer
from tests.durability.support import cli, counting_contract, make_home, truss

MUTATIONS = json.loads((Path(__file__).parent / "tamper" / "mutations.json").read_text(encoding="utf-8"))


def _steps(*tools: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f"mcp:cnt:{tool}", {"key": f"k-{tool}"}) for tool in tools]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The home of a small real ledger: sessions pass, fail, denied, waiting (approved), erased."""
    return build_ledger(tmp_path_factory.mktemp("tamper"))


def build_ledger(base: Path) -> Path:
    """Record the small real ledger in ``base/home`` (SQLite); the PostgreSQL suite migrates it."""
    python_peer("mcp-server-time")  # the peer environment the counting server runs in
    home = make_home(base / "home")
    work = base / "work"
    work.mkdir()
    deny = '\n[[policy.rules]]\ntool = "mcp:cnt:other"\neffect = "deny"\nreason = "no deploys"\n'
    ask = '\n[[policy.rules]]\ntool = "mcp:cnt:other"\neffect = "ask"\nreason = "a person decides"\n'
    denying = counting_contract(work, name="denying", steps=_steps("other"), check_tool="mcp:cnt:other", contract=deny)
    asking = counting_contract(work, name="asking", steps=_steps("other"), check_tool="mcp:cnt:other", contract=ask)
    runs = [
        ("pass", counting_contract(work, name="passing", steps=_steps("count"), check_tool="mcp:cnt:count"), 0),
        ("fail", counting_contract(work, name="failing", steps=_steps("count"), check_tool="mcp:cnt:other"), 1),
        ("denied", denying, 1),
        ("waiting", asking, 3),
        ("erased", counting_contract(work, name="erasing", steps=_steps("count"), check_tool="mcp:cnt:count"), 0),
    ]
    for session, contract, code in runs:
        done = truss(home, "run", str(contract), "--session", session)
        assert done.returncode == code, done.stdout + done.stderr
    shown = json.loads(cli(home, "--json", "ledger", "show", "waiting").stdout)
    call = next(e["entry"]["body"]["call"] for e in shown["entries"] if e["kind"] == "approval_requested")
    assert cli(home, "approve", "waiting", call).returncode == 0
    assert cli(home, "ledger", "erase", "erased", "--payloads").returncode == 0
    assert cli(home, "ledger", "verify", "--all").returncode == 0
    return home


def outputs(home: Path, db: tuple[str, ...] = ()) -> dict[str, tuple[int, str]]:
    """What every reading command says about this ledger (exit code and output); ``db``: ``--db URL``."""
    out: dict[str, tuple[int, str]] = {}
    for name, args in (("list", ("ledger", "list")), ("sessions", ("sessions",))):
        done = cli(home, *db, "--json", *args)
        out[name] = (done.returncode, done.stdout)
    for session in ("pass", "fail", "denied", "waiting", "erased"):
        bundle = home / f"{session}.bundle.json"
        for name, args in (
            ("show", ("ledger", "show", session, "--full")),
            ("export", ("ledger", "export", session, "-o", str(bundle))),
            ("verdict", ("ledger", "verdict", session)),
            ("replay", ("replay", session)),
        ):
            done = cli(home, *db, "--json", *args)
            text = done.stdout.replace(str(home), "HOME")
            if name == "export" and bundle.exists():
                text += bundle.read_text(encoding="utf-8")
                bundle.unlink()
            out[f"{name} {session}"] = (done.returncode, text)
    return out


def flip(value: Any) -> Any:
    if isinstance(value, int):
        return value ^ 1
    if isinstance(value, bytes):
        return value[:-1] + bytes([value[-1] ^ 1]) if value else b"\x01"
    if isinstance(value, str):
        return value[:-1] + chr(ord(value[-1]) ^ 1) if value else "x"
    return 1


def _mutations(db: Path) -> Iterator[tuple[str, str]]:
    """Every (table, mutation) the data file names, as SQL to run on a copy."""
    with sqlite3.connect(db) as conn:
        for table, spec in MUTATIONS["tables"].items():
            rows = conn.execute(f"SELECT * FROM {table}").fetchall() if _has(conn, table) else []
            if not rows:
                continue
            for column in spec["columns"]:
                for kind in MUTATIONS["column_kinds"]:
                    yield table, f"{kind} {column}"
            for kind in MUTATIONS["row_kinds"]:
                yield table, kind


def _has(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def _apply(db: Path, table: str, mutation: str) -> bool:
    """Apply one mutation to ``db``; False when it cannot apply to this ledger (nothing to change)."""
    key = MUTATIONS["tables"][table]["key"]
    conn = sqlite3.connect(db)
    try:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        rows = [dict(zip(columns, r, strict=True)) for r in conn.execute(f"SELECT * FROM {table}")]
        values = rows[len(rows) // 2]
        where = " AND ".join(f"{k} = ?" for k in key)

        def at(row: dict[str, Any]) -> list[Any]:
            return [row[k] for k in key]

        kind, _, column = mutation.partition(" ")
        try:
            if kind in ("byte_flip", "value_change"):
                if values[column] is None:
                    if kind == "byte_flip":
                        return False
                    new: Any = 1
                elif kind == "byte_flip":
                    new = flip(values[column])
                else:
                    different = [r[column] for r in rows if r[column] != values[column]]
                    new = different[0] if different else flip(values[column])
                conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", [new, *at(values)])
            elif kind == "row_delete":
                conn.execute(f"DELETE FROM {table} WHERE {where}", at(values))
            elif kind in ("row_insert", "duplicate"):
                copy = dict(values)
                for name in key:
                    copy[name] = fresh_key(copy[name])
                if kind == "row_insert":  # a forged row: its own values changed too
                    for name in columns:
                        if name not in key and copy[name] is not None:
                            copy[name] = flip(copy[name])
                marks = ", ".join("?" * len(columns))
                names = ", ".join(columns)
                conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", [copy[c] for c in columns])
            elif kind == "row_swap":
                other = rows[0] if rows[0] is not values else rows[-1]
                payload = [c for c in columns if c not in key]
                if other is values or not payload:
                    return False
                sets = ", ".join(f"{c} = ?" for c in payload)
                update = f"UPDATE {table} SET {sets} WHERE {where}"
                conn.execute(update, [other[c] for c in payload] + at(values))
                conn.execute(update, [values[c] for c in payload] + at(other))
            else:
                raise AssertionError(f"unknown mutation kind {kind!r} in mutations.json")
        except sqlite3.IntegrityError:
            return False
        conn.commit()
        return True
    finally:
        conn.close()


def fresh_key(value: Any) -> Any:
    if isinstance(value, int):
        return value + 1_000_000
    if isinstance(value, bytes):
        return value + b"x"
    return f"{value}x"


def test_every_column_of_the_ledger_schema_is_named_by_the_mutation_data(ledger: Path) -> None:
    with sqlite3.connect(ledger / "ledger.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            assert table in MUTATIONS["tables"], f"table {table} is not covered by tamper/mutations.json"
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            assert sorted(columns) == sorted(MUTATIONS["tables"][table]["columns"]), (
                f"columns of {table} changed: cover each new one in tamper/mutations.json"
            )


@pytest.mark.peers
def test_every_key_less_mutation_fails_verification_or_changes_no_command_output(ledger: Path, tmp_path: Path) -> None:
    baseline_home = tmp_path / "baseline"
    shutil.copytree(ledger, baseline_home)
    baseline = outputs(baseline_home)
    assert all(code in (0, 1, 2, 3) for code, _ in baseline.values()), baseline
    escaped: list[str] = []
    tried = 0
    for table, mutation in _mutations(ledger / "ledger.db"):
        if table in MUTATIONS["not_evidence"]:
            continue
        absent = MUTATIONS["availability"]["mutations"].get(table, [])
        if "*" in absent or mutation in absent:
            continue  # makes a payload absent, never wrong (the data file says why)
        home = tmp_path / f"m{tried}"
        shutil.copytree(ledger, home)
        if not _apply(home / "ledger.db", table, mutation):
            shutil.rmtree(home)
            continue
        tried += 1
        verify = cli(home, "--json", "ledger", "verify", "--all")
        if verify.returncode == 0:
            changed = [name for name, got in outputs(home).items() if got != baseline[name]]
            if changed:
                escaped.append(f"{table}: {mutation} passes verify --all but changes {', '.join(changed)}")
        elif verify.returncode not in (1, 2) or "internal error" in verify.stderr:
            # Refused as tampered (1) or as not a usable ledger (2), with a clear message: never a crash.
            escaped.append(f"{table}: {mutation}: verify exit {verify.returncode}: {verify.stderr.strip()[:200]}")
        shutil.rmtree(home)
    assert tried > 40, f"only {tried} mutations applied"
    assert not escaped, "\n".join(escaped)
