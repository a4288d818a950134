"""The home's identity key across rotations: ``truss key rotate`` and the key history file.

Rotation (``rotate_identity_key``), in an order that survives a crash at any point:

1. the new key is written beside the current one as ``<key>.next`` (mode 0600, fsync'd), or
   taken from there when an earlier rotation stopped after writing it;
2. the rotation statement (``keyhistory.rotation_record``: the old key signs the new verifier key
   and the index from which it signs, the new key signs its consent) is appended to ``@log``
   with the old key, at exactly the index it names (``expect_index``; retried when other writers
   move the log on), and a checkpoint covering it is signed with the old key;
3. ``<key>.history`` (public: the verifier keys this home has signed with, oldest first, one a
   line) gains the new key;
4. ``<key>.next`` replaces ``<key>`` (an atomic rename).

A rotation stopped after step 2 is completed by running ``truss key rotate`` again: the store
refuses the old key (retired), the statement in the log names the prepared key, and steps 3 and
4 are done. The log's origin (the name of every key) never changes. The first line of the
history file is the key a home's own verification starts from when no ``--trusted-key`` is
given (``trust_root``), except in a worker home: there ``<key>.root`` names the log key, and
verification starts from it (a worker's own key is admitted by a statement the log key signed).

What it does not do: decide trust for auditors (they pass their starting key), or verify (the
ledger's ``keyhistory.follow_rotations`` does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truss._errors import KeyFileError, StoreConflictError, UsageError
from truss.ledger.entry import StoredEntry
from truss.ledger.keyhistory import LOG_SESSION, ensure_log_session, rotation_record
from truss.ledger.keys import IdentityKey, VerifierKey, write_identity_key
from truss.ledger.stores.base import LedgerStore
from truss.ledger.workers import end_checkpoint

__all__ = [
    "RotationResult",
    "history_path",
    "next_key_path",
    "read_history",
    "read_root",
    "root_path",
    "rotate_identity_key",
    "trust_root",
    "write_root",
]

_ATTEMPTS = 50


StoreOpener = Callable[[IdentityKey | None], LedgerStore]
"""Opens the home's ledger: for writing with the key given, read-only with ``None``."""


def history_path(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".history")


def next_key_path(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".next")


def read_history(key_path: Path) -> list[VerifierKey]:
    """The verifier keys of ``<key>.history``, oldest first (empty when there is no such file)."""
    path = history_path(key_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the key history ({type(exc).__name__})", file=str(path)) from None
    return [VerifierKey.parse(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def root_path(key_path: Path) -> Path:
    """``<key>.root``: a worker home's trust root, the log key's verifier key (``truss init --join``)."""
    return key_path.with_name(key_path.name + ".root")


def read_root(key_path: Path) -> VerifierKey | None:
    """The log key a worker home trusts (``<key>.root``), or None for a home whose own key is the log's."""
    path = root_path(key_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the log's key ({type(exc).__name__})", file=str(path)) from None
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1:
        raise KeyFileError(f"{path}: holds one verifier key (the log key)", file=str(path))
    return VerifierKey.parse(lines[0])


def write_root(key_path: Path, log_key: VerifierKey) -> None:
    """Record ``log_key`` as the trust root of a worker home (public: no secret in it)."""
    _write_atomic(root_path(key_path), f"# the log key this worker's verification starts from\n{log_key.vkey}\n")


def trust_root(key_path: Path) -> list[VerifierKey]:
    """The key a home's own verification starts from: the log key for a worker home (``<key>.root``);
    otherwise its first key when it rotated, else its key."""
    root = read_root(key_path)
    if root is not None:
        return [root]
    history = read_history(key_path)
    if history:
        return history[:1]
    return [IdentityKey.load(key_path).verifier]


@dataclass(frozen=True)
class RotationResult:
    old: VerifierKey
    new: VerifierKey
    statement: StoredEntry | None
    from_index: int
    checkpoint: str | None
    completed_earlier: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old.vkey,
            "new": self.new.vkey,
            "from_index": self.from_index,
            "statement": None if self.statement is None else self.statement.to_json(),
            "checkpoint": self.checkpoint,
            "completed_earlier": self.completed_earlier,
        }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _statement_for(store: LedgerStore, old: IdentityKey) -> StoredEntry | None:
    found = None
    if store.session(LOG_SESSION) is None:
        return None
    for item in store.read_session(LOG_SESSION):
        if item.kind == "key_rotated" and item.body.get("replaces") == old.verifier.vkey:
            found = item
    return found


def rotate_identity_key(key_path: Path, open_store: StoreOpener) -> RotationResult:
    """Rotate the identity key at ``key_path`` (see the module docstring); returns what was done."""
    old = IdentityKey.load(key_path)
    pending = next_key_path(key_path)
    if pending.exists():
        new = IdentityKey.load(pending)
        if new.name != old.name:
            raise KeyFileError(
                f"{pending}: the prepared key is named {new.name!r}, not {old.name!r}",
                remedy=f"move {pending} away and run `truss key rotate` again",
                file=str(pending),
            )
    else:
        new = IdentityKey.generate(old.name)
        write_identity_key(pending, new)
    statement: StoredEntry | None = None
    checkpoint: str | None = None
    completed = False
    try:
        store = open_store(old)
    except KeyFileError as exc:
        if exc.fields.get("reason") != "key_retired":
            raise
        with closing(open_store(None)) as reader:
            statement = _statement_for(reader, old)
        if statement is None or statement.body.get("key") != new.verifier.vkey:
            raise KeyFileError(
                f"{key_path}: this key was already rotated, to a key other than the one prepared in {pending}",
                remedy="the current key is the one the log's last rotation names; restore it from your backup",
                file=str(key_path),
            ) from None
        completed = True
    else:
        with closing(store):
            ensure_log_session(store)
            for _ in range(_ATTEMPTS):
                size = store.tree_size()
                try:
                    [statement] = store.append(
                        LOG_SESSION, [rotation_record(old, new, size + 1)], durable=True, expect_index=size
                    )
                    break
                except StoreConflictError as exc:
                    if exc.fields.get("actual") is None:
                        raise
                    continue  # another writer appended first: name the new position and try again
            else:
                raise UsageError(
                    f"the log kept moving: no rotation could be recorded in {_ATTEMPTS} attempts",
                    remedy="run `truss key rotate` again when fewer runs are writing",
                )
            signed = end_checkpoint(store, old)  # a worker's key signs none: the log key's publisher does
            checkpoint = None if signed.note is None else signed.note.decode("utf-8")
    assert statement is not None
    history = read_history(key_path) or [old.verifier]
    if new.verifier not in history:
        history.append(new.verifier)
    _write_atomic(history_path(key_path), "".join(k.vkey + "\n" for k in history))
    pending.replace(key_path)
    _fsync_dir(key_path.parent)
    return RotationResult(
        old.verifier, new.verifier, statement, int(statement.body.get("from_index", 0)), checkpoint, completed
    )
