"""The OAuth token store: credentials kept outside the ledger, keyed by (issuer, resource).

One *grant* per (authorization server issuer, MCP server resource URI): the tokens the issuer gave
for that resource and the client registration they were obtained with. A token is only ever
looked up for the resource it was issued for, so a token for server A is never sent to server B.

Where the secrets live (``backend``):

- ``keyring``: the OS keyring (the ``keyring`` package: Secret Service, macOS Keychain, Windows
  Credential Locker), one item per grant under the service ``truss-oauth``;
- ``file``: ``DIR/tokens.enc``, AES-256-GCM with a random key in ``DIR/tokens.key``; both mode
  0600, written atomically. Used when no keyring is usable (a container, CI, a server).

Several Truss processes may share one home (two ``truss mcp login`` at once, a run refreshing a
token while another logs in): every read and every read-modify-write of the index and the token
file holds a lock on ``DIR/lock`` (``flock``: shared to read, exclusive to change), so no process
reads a half-written file and no update is lost.

``DIR/index.json`` (mode 0600) lists the grants' non-secret facts (issuer, resource, server name,
grant, client id, scopes, expiry) for ``truss mcp auth status`` and for finding a grant by its
resource; it never holds a token or a secret. What the file backend protects against and what
not: docs/security.md.

Every secret read from or written to the store is registered with the redactor
(``truss.redaction.remember_secret``) before it goes anywhere else.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from truss._errors import InputError
from truss.redaction import remember_secret

__all__ = ["Grant", "TokenStore", "keyring_usable"]

Backend = Literal["auto", "keyring", "file"]
_SERVICE = "truss-oauth"
_SECRET_KEYS = ("access_token", "refresh_token", "id_token", "client_secret")


@dataclass
class Grant:
    """One stored grant: its non-secret facts and (``tokens``, ``client``) the secret parts as JSON."""

    issuer: str
    resource: str
    server: str
    grant: str
    client_id: str | None = None
    scopes: list[str] = field(default_factory=list[str])
    expires_at_ms: int | None = None
    obtained_at_ms: int = 0
    wanted_scopes: list[str] = field(default_factory=list[str])
    tokens: dict[str, Any] = field(default_factory=dict[str, Any])
    client: dict[str, Any] = field(default_factory=dict[str, Any])
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    """The authorization server's metadata (RFC 8414) the tokens came from: where to refresh them."""

    @property
    def key(self) -> str:
        return grant_key(self.issuer, self.resource, self.client_id)

    def facts(self) -> dict[str, Any]:
        """What may be shown and indexed: never a token, never a secret."""
        return {
            "issuer": self.issuer,
            "resource": self.resource,
            "server": self.server,
            "grant": self.grant,
            "client_id": self.client_id,
            "scopes": list(self.scopes),
            "expires_at_ms": self.expires_at_ms,
            "obtained_at_ms": self.obtained_at_ms,
            "refreshable": bool(self.tokens.get("refresh_token")),
            "wanted_scopes": list(self.wanted_scopes),
        }

    def secret(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "client": self.client, "metadata": self.metadata}


def grant_key(issuer: str, resource: str, client_id: str | None = None) -> str:
    """The store's key: (issuer, resource), and the client, so two clients of one server never share tokens."""
    return f"{issuer} {resource} {client_id or ''}".rstrip()


def remember_all(value: Any) -> None:
    """Register every token and secret inside a stored or received record with the redactor."""
    if isinstance(value, dict):
        for key, item in cast(dict[str, Any], value).items():
            if key in _SECRET_KEYS and isinstance(item, str):
                remember_secret(item)
            else:
                remember_all(item)


def keyring_usable() -> bool:
    """True when the OS keyring has a real backend (not the ``fail`` or ``null`` one)."""
    try:
        import keyring
        from keyring.backends import fail

        backend: Any = keyring.get_keyring()
        if isinstance(backend, fail.Keyring) or float(getattr(backend, "priority", 0)) <= 0:
            return False
        return "null" not in type(backend).__module__
    except Exception:
        return False


class TokenStore:
    """The grants under ``directory`` (``$TRUSS_HOME/oauth``); see the module docstring."""

    def __init__(self, directory: Path, *, backend: Backend = "auto") -> None:
        self.directory = directory
        chosen = os.environ.get("TRUSS_OAUTH_STORE", backend) if backend == "auto" else backend
        if chosen not in ("auto", "keyring", "file"):
            raise InputError(
                f"TRUSS_OAUTH_STORE is {chosen!r}",
                remedy="Set it to keyring or file, or unset it to let Truss choose",
            )
        self.backend: Literal["keyring", "file"] = (
            ("keyring" if keyring_usable() else "file") if chosen == "auto" else cast(Any, chosen)
        )

    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Generator[None]:
        """Hold ``DIR/lock``: exclusive around a change, shared around a read (see the module docstring)."""
        if not exclusive and not self.directory.exists():
            yield  # nothing stored yet, and a read must not create the folder
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    # -- the index (non-secret) --------------------------------------------------------------

    @property
    def _index_path(self) -> Path:
        return self.directory / "index.json"

    def _index(self) -> dict[str, dict[str, Any]]:
        try:
            data: Any = json.loads(self._index_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise InputError(
                f"the OAuth token index {self._index_path} cannot be read ({type(exc).__name__})",
                remedy="Remove it and log in again with `truss mcp login SERVER`",
            ) from None
        return cast(dict[str, dict[str, Any]], data) if isinstance(data, dict) else {}

    def _write_index(self, index: dict[str, dict[str, Any]]) -> None:
        _write_private(self._index_path, json.dumps(index, indent=2, sort_keys=True).encode())

    # -- the secrets ---------------------------------------------------------------------------

    def _secret_get(self, key: str) -> dict[str, Any] | None:
        if self.backend == "keyring":
            import keyring

            text = keyring.get_password(_SERVICE, key)
            return cast(dict[str, Any], json.loads(text)) if text else None
        return self._file_secrets().get(key)

    def _secret_set(self, key: str, value: dict[str, Any] | None) -> None:
        if self.backend == "keyring":
            import keyring
            from keyring.errors import PasswordDeleteError

            if value is None:
                with contextlib.suppress(PasswordDeleteError):
                    keyring.delete_password(_SERVICE, key)
            else:
                keyring.set_password(_SERVICE, key, json.dumps(value, sort_keys=True))
            return
        everything = self._file_secrets()
        if value is None:
            everything.pop(key, None)
        else:
            everything[key] = value
        self._write_file_secrets(everything)

    def _file_key(self, *, create: bool) -> bytes | None:
        path = self.directory / "tokens.key"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if not create:
                return None
            raw = base64.b64encode(os.urandom(32))
            _write_private(path, raw)  # under the exclusive lock: no other process creates it meanwhile
            return base64.b64decode(raw)
        _check_private(path)
        try:
            key = base64.b64decode(raw.strip(), validate=True)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise InputError(
                f"the OAuth token key {path} is not a 32-byte key",
                remedy="Remove tokens.key and tokens.enc in that folder and log in again with `truss mcp login`",
            )
        return key

    def _file_secrets(self) -> dict[str, dict[str, Any]]:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        path = self.directory / "tokens.enc"
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return {}
        _check_private(path)
        key = self._file_key(create=False)
        if key is None or len(blob) < 13 or blob[:1] != b"\x01":
            raise InputError(
                f"the OAuth token file {path} cannot be decrypted (its key is missing or it is not a Truss token file)",
                remedy="Remove tokens.enc in that folder and log in again with `truss mcp login`",
            )
        try:
            plain = AESGCM(key).decrypt(blob[1:13], blob[13:], b"truss-oauth-v1")
        except InvalidTag:
            raise InputError(
                f"the OAuth token file {path} does not decrypt with its key (changed or corrupted)",
                remedy="Remove tokens.enc in that folder and log in again with `truss mcp login`",
            ) from None
        data: Any = json.loads(plain)
        return cast(dict[str, dict[str, Any]], data)

    def _write_file_secrets(self, everything: dict[str, dict[str, Any]]) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self._file_key(create=True)
        assert key is not None
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(nonce, json.dumps(everything, sort_keys=True).encode(), b"truss-oauth-v1")
        _write_private(self.directory / "tokens.enc", b"\x01" + nonce + sealed)

    # -- grants ---------------------------------------------------------------------------------

    def find(self, resource: str, issuer: str | None = None, client_id: str | None = None) -> Grant | None:
        """The grant for ``resource`` (from ``issuer`` and for ``client_id`` when given; else the newest)."""
        with self._locked(exclusive=False):
            return self._find(resource, issuer, client_id)

    def _find(self, resource: str, issuer: str | None, client_id: str | None) -> Grant | None:
        index = self._index()
        candidates = [
            (key, facts)
            for key, facts in index.items()
            if facts.get("resource") == resource
            and (issuer is None or _same_issuer(facts.get("issuer"), issuer))
            and (client_id is None or facts.get("client_id") == client_id)
        ]
        if not candidates:
            return None
        key, facts = max(candidates, key=lambda kf: int(kf[1].get("obtained_at_ms") or 0))
        secret = self._secret_get(key) or {}
        remember_all(secret)
        return Grant(
            issuer=str(facts["issuer"]),
            resource=resource,
            server=str(facts.get("server") or ""),
            grant=str(facts.get("grant") or ""),
            client_id=facts.get("client_id"),
            scopes=_strings(facts.get("scopes")),
            expires_at_ms=facts.get("expires_at_ms"),
            obtained_at_ms=int(facts.get("obtained_at_ms") or 0),
            wanted_scopes=_strings(facts.get("wanted_scopes")),
            tokens=dict(secret.get("tokens") or {}),
            client=dict(secret.get("client") or {}),
            metadata=dict(secret.get("metadata") or {}),
        )

    def save(self, grant: Grant) -> None:
        remember_all(grant.secret())
        with self._locked(exclusive=True):
            self._secret_set(grant.key, grant.secret())
            index = self._index()
            index[grant.key] = grant.facts()
            self._write_index(index)

    def delete(self, resource: str, issuer: str | None = None) -> list[dict[str, Any]]:
        """Forget the grants for ``resource`` (from ``issuer`` when given); their facts."""
        with self._locked(exclusive=True):
            return self._delete(resource, issuer)

    def _delete(self, resource: str, issuer: str | None) -> list[dict[str, Any]]:
        index = self._index()
        gone = [
            key
            for key, facts in index.items()
            if facts.get("resource") == resource and (issuer is None or _same_issuer(facts.get("issuer"), issuer))
        ]
        removed = [index.pop(key) for key in gone]
        for key in gone:
            self._secret_set(key, None)
        if gone:
            self._write_index(index)
        return removed

    def facts(self) -> list[dict[str, Any]]:
        """Every stored grant's non-secret facts, by resource then issuer."""
        with self._locked(exclusive=False):
            index = self._index()
        return sorted(index.values(), key=lambda f: (str(f.get("resource")), str(f.get("issuer"))))


def _strings(value: Any) -> list[str]:
    return [str(item) for item in cast(list[Any], value)] if isinstance(value, list) else []


def _same_issuer(a: Any, b: str) -> bool:
    return isinstance(a, str) and a.rstrip("/") == b.rstrip("/")


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InputError(
            f"{path} is readable by other users (mode {mode:o}); it holds OAuth secrets",
            remedy=f"chmod 600 {path}, or remove it and log in again with `truss mcp login`",
        )


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600, atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.urandom(6).hex()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
