"""A witness's own state: its config, its keys, and what it cosigned, in one directory.

Layout of a witness directory (``truss witness init --dir DIR``)::

    DIR/config.toml        the logs it follows, its rate limit
    DIR/witness.key        its Ed25519 cosigner key (mode 0600)
    DIR/witness-mldsa.key  optional: its ML-DSA-44 cosigner key (where `cryptography` has ML-DSA)
    DIR/state.db           SQLite: the latest cosigned checkpoint per log, history, evidence

``config.toml``::

    max_per_minute = 60              # add-checkpoint requests per log per minute (429 beyond)
    [[log]]
    origin = "example.com/truss"     # optional: defaults to the first key's name
    keys = ["example.com/truss+1234abcd+AX...", ...]   # the log's verifier keys (all of a rotation)

``WitnessState.submit`` is the check-and-persist transaction: ``BEGIN IMMEDIATE``, read the log's
latest cosigned checkpoint, ``witness.judge``, then either cosign (dated no earlier than the log's
last cosignature, whatever the clock says) and store the new checkpoint, or keep the refused
request as evidence when it was validly signed yet inconsistent, and commit
(``synchronous=FULL``) before answering. Two submissions, from threads or processes, are
serialised by the database, so both can never be cosigned on diverging trees.

What it does not do: HTTP (``server``) or the protocol checks (``truss.ledger.witness``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from truss._errors import InputError, KeyFileError, PolicyError, StoreError
from truss.ledger.cosignature import cosign
from truss.ledger.keys import CosignerKey, VerifierKey
from truss.ledger.note import Note, NoteSignature, parse_note
from truss.ledger.witness import LogState, Refusal, Submission, judge

__all__ = [
    "CONFIG_FILE",
    "ED25519_KEY_FILE",
    "MLDSA_KEY_FILE",
    "STATE_FILE",
    "Cosigned",
    "Evidence",
    "FollowedLog",
    "WitnessDirConfig",
    "WitnessState",
    "load_dir_config",
    "load_keys",
]

CONFIG_FILE = "config.toml"
ED25519_KEY_FILE = "witness.key"
MLDSA_KEY_FILE = "witness-mldsa.key"
STATE_FILE = "state.db"
_MAX_EVIDENCE = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS latest (
    origin TEXT PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL, note BLOB NOT NULL, ts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cosigned (
    id INTEGER PRIMARY KEY, origin TEXT NOT NULL, size INTEGER NOT NULL, root BLOB NOT NULL,
    note BLOB NOT NULL, ts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    id INTEGER PRIMARY KEY, origin TEXT NOT NULL, received_ms INTEGER NOT NULL, reason TEXT NOT NULL,
    status INTEGER NOT NULL, old_size INTEGER NOT NULL, size INTEGER NOT NULL, root BLOB NOT NULL,
    request BLOB NOT NULL, held_note BLOB
);
"""


class _LogModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    origin: str | None = None
    keys: list[str] = Field(min_length=1, max_length=64)


class _ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_per_minute: int = Field(default=60, ge=1, le=100_000)
    log: list[_LogModel] = Field(default_factory=list[_LogModel], max_length=1000)


@dataclass(frozen=True)
class FollowedLog:
    origin: str
    keys: tuple[VerifierKey, ...]


@dataclass(frozen=True)
class WitnessDirConfig:
    directory: Path
    max_per_minute: int
    logs: Mapping[str, FollowedLog]

    def trusted(self) -> dict[str, Sequence[VerifierKey]]:
        return {origin: log.keys for origin, log in self.logs.items()}


def load_dir_config(directory: Path) -> WitnessDirConfig:
    """Read ``DIR/config.toml``; ``PolicyError`` naming the file for anything wrong in it."""
    path = directory / CONFIG_FILE
    file = str(path)
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyError(
            "the witness has no config file", remedy="create it with `truss witness init --dir DIR`", file=file
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"the witness config cannot be read: {exc}", file=file) from None
    try:
        model = _ConfigModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise PolicyError(f"{where}: {first.get('msg')}", file=file) from None
    logs: dict[str, FollowedLog] = {}
    for number, log in enumerate(model.log):
        try:
            keys = tuple(VerifierKey.parse(text) for text in log.keys)
        except InputError as exc:
            raise PolicyError(f"log[{number}].keys: {exc.message}", file=file) from None
        origin = log.origin or keys[0].name
        if any(key.name != origin for key in keys):
            raise PolicyError(f"log[{number}]: every key of a log is named after its origin {origin!r}", file=file)
        if origin in logs:
            raise PolicyError(f"log[{number}]: the log {origin!r} is listed twice", file=file)
        logs[origin] = FollowedLog(origin, keys)
    return WitnessDirConfig(directory, model.max_per_minute, logs)


def load_keys(directory: Path) -> list[CosignerKey]:
    """The witness's cosigner keys: Ed25519 always, ML-DSA-44 when its file exists."""
    keys = [CosignerKey.load(directory / ED25519_KEY_FILE)]
    mldsa = directory / MLDSA_KEY_FILE
    if mldsa.exists():
        keys.append(CosignerKey.load(mldsa))
    if len({k.name for k in keys}) != 1:
        raise KeyFileError("the witness's keys have different names", file=str(directory))
    return keys


@dataclass(frozen=True)
class Cosigned:
    origin: str
    size: int
    root: bytes
    ts: int
    note: bytes


@dataclass(frozen=True)
class Evidence:
    id: int
    origin: str
    received_ms: int
    reason: str
    status: int
    old_size: int
    size: int
    root: bytes
    request: bytes
    held_note: bytes | None


def _held_note(submission: Submission, lines: Sequence[NoteSignature]) -> bytes:
    # What the witness serves back: the log's signature line(s) it verified and its cosignatures,
    # not whatever other lines the submitter sent along (other witnesses', or one under the log's
    # name by a key it does not know, which a monitor knowing that key would find bad).
    parsed = parse_note(submission.request.checkpoint)
    return Note(text=parsed.text, signatures=(*submission.log_signatures, *lines)).to_bytes()


class WitnessState:
    """The SQLite state of one witness (see the module docstring). Thread-safe."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._conn.execute(statement)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: the witness state cannot be opened ({exc})", db=str(path)) from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> WitnessState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _latest(self, origin: str) -> LogState | None:
        row = self._conn.execute("SELECT size, root, note FROM latest WHERE origin = ?", (origin,)).fetchone()
        return None if row is None else LogState(int(row[0]), bytes(row[1]), bytes(row[2]))

    def submit(
        self,
        submission: Submission,
        keys: Sequence[CosignerKey],
        now_ms: Callable[[], int],
    ) -> tuple[int, list[NoteSignature], Refusal | None, int | None]:
        """Judge and persist in one transaction: ``(status, lines, refusal, conflict size)``."""
        checkpoint = submission.checkpoint
        origin = checkpoint.origin
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                state = self._latest(origin)
                verdict = judge(submission, state)
                if verdict.ok:
                    # Never dated before the log's last cosignature: a clock stepping back would make
                    # the two read as this witness seeing a larger tree, then a smaller one.
                    last = conn.execute("SELECT ts FROM latest WHERE origin = ?", (origin,)).fetchone()
                    ms = max(now_ms(), 0 if last is None else int(last[0]))
                    text = checkpoint.text()
                    lines = [cosign(text, key, max(1, ms // 1000)) for key in keys]
                    note = _held_note(submission, lines)
                    conn.execute(
                        "INSERT OR REPLACE INTO latest (origin, size, root, note, ts) VALUES (?,?,?,?,?)",
                        (origin, checkpoint.size, checkpoint.root, note, ms),
                    )
                    conn.execute(
                        "INSERT INTO cosigned (origin, size, root, note, ts) VALUES (?,?,?,?,?)",
                        (origin, checkpoint.size, checkpoint.root, note, ms),
                    )
                    conn.execute("COMMIT")
                    return 200, lines, None, None
                refusal = verdict.refusal
                assert refusal is not None
                if refusal.evidence:
                    count = conn.execute("SELECT COUNT(*) FROM evidence").fetchone()
                    if count is None or int(count[0]) < _MAX_EVIDENCE:
                        conn.execute(
                            "INSERT INTO evidence (origin, received_ms, reason, status, old_size, size, root, request,"
                            " held_note) VALUES (?,?,?,?,?,?,?,?,?)",
                            (
                                origin,
                                now_ms(),
                                refusal.reason,
                                refusal.status,
                                submission.request.old_size,
                                checkpoint.size,
                                checkpoint.root,
                                submission.request.checkpoint,
                                None if state is None else state.note,
                            ),
                        )
                conn.execute("COMMIT")
                return refusal.status, [], refusal, verdict.conflict_size
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                message = f"{self.path}: the witness state could not be updated ({exc})"
                raise StoreError(message, db=str(self.path)) from None

    def latest(self) -> list[Cosigned]:
        with self._lock:
            rows = self._conn.execute("SELECT origin, size, root, ts, note FROM latest ORDER BY origin").fetchall()
        return [Cosigned(str(r[0]), int(r[1]), bytes(r[2]), int(r[3]), bytes(r[4])) for r in rows]

    def latest_for(self, origin: str) -> Cosigned | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT origin, size, root, ts, note FROM latest WHERE origin = ?", (origin,)
            ).fetchone()
        return None if row is None else Cosigned(str(row[0]), int(row[1]), bytes(row[2]), int(row[3]), bytes(row[4]))

    def history(self, origin: str | None = None, *, limit: int = 100) -> list[Cosigned]:
        sql = "SELECT origin, size, root, ts, note FROM cosigned"
        params: tuple[Any, ...] = ()
        if origin is not None:
            sql += " WHERE origin = ?"
            params = (origin,)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._lock:
            rows = self._conn.execute(sql, (*params, _sql_limit(limit))).fetchall()
        return [Cosigned(str(r[0]), int(r[1]), bytes(r[2]), int(r[3]), bytes(r[4])) for r in rows]

    def evidence(self, *, limit: int = 100) -> list[Evidence]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, origin, received_ms, reason, status, old_size, size, root, request, held_note"
                " FROM evidence ORDER BY id DESC LIMIT ?",
                (_sql_limit(limit),),
            ).fetchall()
        return [_evidence(r) for r in rows]


def _sql_limit(limit: int) -> int:
    """SQLite's LIMIT for ``limit`` rows: 0 (or less) means all, which SQLite writes as -1."""
    return limit if limit > 0 else -1


def _evidence(r: Any) -> Evidence:
    held = None if r[9] is None else bytes(r[9])
    return Evidence(
        int(r[0]), str(r[1]), int(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]), bytes(r[7]), bytes(r[8]), held
    )
