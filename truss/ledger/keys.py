"""Ed25519 identity and verifier keys, in C2SP signed-note key formats. The only module importing PyNaCl
(and the only one reaching ``cryptography``, for ML-DSA-44 cosignatures).

- ``IdentityKey``: the private key a Truss home signs entries, checkpoints and envelopes with.
  Its file (``$TRUSS_HOME/identity.key``, mode 0600) holds one line in the signed-note private
  key form ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || seed)>``. Its name is the log's
  origin.
- ``VerifierKey``: the public half, ``<name>+<hex key id>+<base64(0x01 || pubkey)>``, where the
  key id is ``SHA-256(name || 0x0A || 0x01 || pubkey)[:4]`` (C2SP signed-note v1.0.0).
- ``TrustedKeys``: the keys a verifier accepts, by key id; several at once for rotation.
- ``CosignerKey`` / ``CosignerVerifier``: a witness's own key for C2SP cosignatures, Ed25519
  (signature type 0x04) or ML-DSA-44 (0x06, through the installed ``cryptography`` when it has
  ML-DSA: ``mldsa44_available``), with the key id computed over its type byte.

What it does not do: decide what is trusted (callers pass the set), or read keys other than the
files ``IdentityKey.load`` and ``CosignerKey.load`` are pointed at.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import importlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from truss._errors import KeyFileError
from truss.ledger.note import is_origin

__all__ = [
    "COSIGNATURE_ALG_NAMES",
    "ED25519_ALG",
    "ED25519_COSIGNATURE_ALG",
    "MLDSA44_COSIGNATURE_ALG",
    "CosignerKey",
    "CosignerVerifier",
    "IdentityKey",
    "TrustedKeys",
    "VerifierKey",
    "key_id_of",
    "mldsa44_available",
    "typed_key_id",
    "write_identity_key",
]

ED25519_ALG = 0x01
_PRIVATE_PREFIX = "PRIVATE+KEY+"
_MAX_NAME = 255


# -- Ed25519: libsodium's crypto_sign through PyNaCl's cffi library --------------------------------
# ``nacl.signing`` imports every PyNaCl binding (AEAD, box, hashing, scrypt...) and was a sixth of
# what `truss ledger verify` costs to start; the compiled library alone is what signing needs. The
# same libsodium calls PyNaCl's SigningKey and VerifyKey make (tests/ledger/test_ledger_keys.py
# checks them against each other), and the one Ed25519 implementation in Truss.

_sodium: Any = importlib.import_module("nacl._sodium")  # PyNaCl's cffi module: ``ffi`` and ``lib``
if _sodium.lib.sodium_init() < 0:  # idempotent; PyNaCl's own bindings call it the same way
    raise ImportError("libsodium failed to initialise")
_ED25519_SIGNATURE_BYTES = 64
_ED25519_SECRET_BYTES = 64  # seed || public key, as libsodium keeps it


def _ed25519_keypair(seed: bytes) -> tuple[bytes, bytes]:
    """``(public key, libsodium secret key)`` of a 32-byte seed."""
    ffi, lib = _sodium.ffi, _sodium.lib
    public = ffi.new("unsigned char[]", 32)
    secret = ffi.new("unsigned char[]", _ED25519_SECRET_BYTES)
    if lib.crypto_sign_seed_keypair(public, secret, seed) != 0:
        raise ValueError("libsodium could not derive an Ed25519 key pair")
    return bytes(ffi.buffer(public, 32)), bytes(ffi.buffer(secret, _ED25519_SECRET_BYTES))


def _ed25519_random_seed() -> bytes:
    ffi = _sodium.ffi
    seed = ffi.new("unsigned char[]", 32)
    _sodium.lib.randombytes(seed, 32)  # what PyNaCl's SigningKey.generate draws from (nacl.utils.random)
    return bytes(ffi.buffer(seed, 32))


def _ed25519_sign(secret: bytes, message: bytes) -> bytes:
    ffi = _sodium.ffi
    signed = ffi.new("unsigned char[]", len(message) + _ED25519_SIGNATURE_BYTES)
    # signature || message; the signed length is known, so libsodium is not asked for it (NULL is allowed)
    if _sodium.lib.crypto_sign(signed, ffi.NULL, message, len(message), secret) != 0:
        raise ValueError("libsodium could not sign")
    return bytes(ffi.buffer(signed, _ED25519_SIGNATURE_BYTES))


def _ed25519_verify(public: bytes, message: object, signature: object) -> bool:
    # Callers may hand over values decoded from untrusted input: anything but bytes does not verify.
    if not isinstance(message, bytes | bytearray) or not isinstance(signature, bytes | bytearray):
        return False
    if len(signature) != _ED25519_SIGNATURE_BYTES:
        return False
    signed = bytes(signature) + bytes(message)  # crypto_sign_open, as PyNaCl's VerifyKey.verify
    ffi = _sodium.ffi
    opened = ffi.new("unsigned char[]", len(signed))
    opened_len = ffi.new("unsigned long long *")
    return _sodium.lib.crypto_sign_open(opened, opened_len, signed, len(signed), public) == 0


def key_id_of(name: str, public_key: bytes) -> bytes:
    """``SHA-256(name || 0x0A || 0x01 || pubkey)[:4]``."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519_ALG]) + public_key).digest()[:4]


def _check_name(name: str, where: str) -> None:
    # C2SP signed-note: a key name is non-empty and holds no spaces, no '+', no Unicode spaces.
    if not name or len(name) > _MAX_NAME or "+" in name or any(ch.isspace() for ch in name):
        raise KeyFileError(
            f"{where}: key name {name!r} is not a valid signed-note key name",
            remedy="use a non-empty name without spaces or '+', such as example.com/truss",
            file=where,
        )


def _key_fields(
    line: str, malformed: Callable[[], KeyFileError], undecodable: Callable[[str], KeyFileError] | None = None
) -> tuple[str, str, bytes]:
    """The name, hex key id and decoded key of a ``<name>+<hex key id>+<base64>`` line.

    Raises ``malformed()`` when the line has not three fields; when the key is not base64,
    ``undecodable(name)`` chained to the decoding error, or (without ``undecodable``: a private
    key, nothing of which is echoed or chained) ``malformed()`` again. The errors are built only
    when raised: a key parses at every verification's start.
    """
    parts = line.split("+", 2)
    if len(parts) != 3:
        raise malformed()
    name, hex_id, b64 = parts
    try:
        return name, hex_id, base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        if undecodable is None:
            raise malformed() from None
        raise undecodable(name) from exc


def _public_key_fields(text: str, what: str, not_a: str, remedy: str) -> tuple[str, str, bytes]:
    """``_key_fields`` of a verifier key line, refused as not ``not_a`` or as ``what`` with a bad key."""
    line = text.strip()
    return _key_fields(
        line,
        lambda: KeyFileError(f"not a {not_a}: {line[:80]!r}", remedy=remedy, file=what),
        lambda name: KeyFileError(f"{what} {name!r}: the key is not valid base64", file=what),
    )


def _check_key_id(key_id: str, hex_id: str, what: str, name: str, remedy: str) -> None:
    if key_id != hex_id.lower():
        raise KeyFileError(
            f"{what} {name!r}: key id {hex_id} does not match the key (expected {key_id})", remedy=remedy, file=what
        )


def _private_key_fields(text: str, bad: KeyFileError) -> tuple[str, str, bytes]:
    """``_key_fields`` of a ``PRIVATE+KEY+`` file's one line; anything malformed raises ``bad``."""
    line = text.strip()
    if not line.startswith(_PRIVATE_PREFIX) or "\n" in line:
        raise bad
    return _key_fields(line[len(_PRIVATE_PREFIX) :], lambda: bad)


def _check_file_key_id(key_id: str, hex_id: str, where: str) -> None:
    if key_id != hex_id.lower():
        raise KeyFileError(f"{where}: the key id in the file does not match the key", file=where)


class VerifierKey:
    """A public Ed25519 key with its name, in the C2SP vkey form."""

    __slots__ = ("key_id", "name", "public_key")

    def __init__(self, name: str, public_key: bytes) -> None:
        _check_name(name, "verifier key")
        if len(public_key) != 32:
            raise KeyFileError("an Ed25519 public key is 32 bytes", file="verifier key")
        self.name = name
        self.public_key = public_key
        self.key_id = key_id_of(name, public_key).hex()

    @classmethod
    def parse(cls, text: str) -> VerifierKey:
        """Parse ``<name>+<hex key id>+<base64(0x01||pubkey)>``; the key id must match."""
        name, hex_id, raw = _public_key_fields(
            text,
            "verifier key",
            "verifier key",
            "give the line `truss key show` prints: <name>+<hex key id>+<base64 key>",
        )
        if len(raw) != 33 or raw[0] != ED25519_ALG:
            raise KeyFileError(
                f"verifier key {name!r} is not an Ed25519 key (algorithm byte 0x01 and 32 key bytes)",
                file="verifier key",
            )
        key = cls(name, raw[1:])
        _check_key_id(key.key_id, hex_id, "verifier key", name, "copy the whole line again from `truss key show`")
        return key

    @property
    def vkey(self) -> str:
        """The C2SP vkey text."""
        encoded = base64.b64encode(bytes([ED25519_ALG]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_id}+{encoded}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        """True when ``signature`` is this key's Ed25519 signature of ``message``."""
        return _ed25519_verify(self.public_key, message, signature)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifierKey) and (self.name, self.public_key) == (other.name, other.public_key)

    def __hash__(self) -> int:
        return hash((self.name, self.public_key))

    def __repr__(self) -> str:
        return f"VerifierKey({self.vkey!r})"


class IdentityKey:
    """A private Ed25519 signing key and its name (the log origin)."""

    __slots__ = ("_secret", "_seed", "key_id", "name", "verifier")

    def __init__(self, name: str, seed: bytes) -> None:
        _check_name(name, "identity key")
        if len(seed) != 32:
            raise KeyFileError("an Ed25519 seed is 32 bytes", file="identity key")
        self.name = name
        self._seed = seed
        public, self._secret = _ed25519_keypair(seed)
        self.verifier = VerifierKey(name, public)
        self.key_id = self.verifier.key_id

    @classmethod
    def from_seed(cls, seed: bytes, name: str) -> IdentityKey:
        """A key from a known seed (test vectors; never for real use)."""
        return cls(name, seed)

    @classmethod
    def generate(cls, name: str | None = None) -> IdentityKey:
        """A fresh random key; the default name is ``truss.local/<16 hex of the public key's hash>``."""
        seed = _ed25519_random_seed()
        if name is None:
            name = "truss.local/" + hashlib.sha256(_ed25519_keypair(seed)[0]).hexdigest()[:16]
        return cls(name, seed)

    @classmethod
    def create(cls, path: Path, name: str | None = None) -> IdentityKey:
        """Generate a key and write it to ``path`` with mode 0600; refuses to overwrite a file.

        ``name`` becomes the origin line of every checkpoint the key signs, so a name that cannot be
        one (``note.is_origin``: a space, a control character or DEL) is refused here, before any
        file is written, rather than by the first checkpoint of every later run.
        """
        if name is not None and not is_origin(name):
            raise KeyFileError(
                f"{name!r} cannot name a log: it becomes the origin line of the log's signed checkpoints, "
                "which holds no spaces, control characters or DEL",
                remedy="choose a name such as example.com/truss",
                file=str(path),
            )
        key = cls.generate(name)
        _write_private(path, key.private_text())
        return key

    @classmethod
    def load(cls, path: Path) -> IdentityKey:
        """Read a key file; refuses one that is missing, malformed, or readable by group or others."""
        try:
            info = path.stat()
        except FileNotFoundError as exc:
            raise KeyFileError(
                f"{path}: no identity key",
                remedy="run `truss init` to create one, or pass --key FILE",
                file=str(path),
            ) from exc
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(
                f"{path}: the identity key is readable or writable by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):03o})",
                remedy=f"restrict it with `chmod 600 {path}`",
                file=str(path),
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"{path}: cannot read the identity key ({type(exc).__name__})", file=str(path)) from exc
        return cls._parse_private(text, str(path))

    @classmethod
    def _parse_private(cls, text: str, where: str) -> IdentityKey:
        # Never echo the text: it is the secret.
        bad = KeyFileError(
            f"{where}: not a Truss identity key (expected one line PRIVATE+KEY+<name>+<id>+<key>)",
            remedy="restore the key file from a backup, or create a new key in a new home with `truss init`",
            file=where,
        )
        name, hex_id, raw = _private_key_fields(text, bad)
        if len(raw) != 33 or raw[0] != ED25519_ALG:
            raise bad
        key = cls(name, raw[1:])
        _check_file_key_id(key.key_id, hex_id, where)
        return key

    def private_text(self) -> str:
        """The file form. Secret: write it only to a 0600 file."""
        seed = self._seed
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_id}+{base64.b64encode(bytes([ED25519_ALG]) + seed).decode()}"

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return _ed25519_sign(self._secret, message)

    def __repr__(self) -> str:
        return f"IdentityKey(name={self.name!r}, key_id={self.key_id!r})"


class TrustedKeys:
    """The verifier keys a check accepts, looked up by key id (several may share one: all are tried)."""

    __slots__ = ("_by_id",)

    def __init__(self, keys: Iterable[VerifierKey] = ()) -> None:
        self._by_id: dict[str, list[VerifierKey]] = {}
        for key in keys:
            self.add(key)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> TrustedKeys:
        return cls(VerifierKey.parse(t) for t in texts)

    def add(self, key: VerifierKey) -> None:
        group = self._by_id.setdefault(key.key_id, [])
        if key not in group:
            group.append(key)

    def get(self, key_id: str) -> list[VerifierKey]:
        return self._by_id.get(key_id, [])

    def verify(self, key_id: str, message: bytes, signature: bytes) -> bool:
        """True when a trusted key with ``key_id`` verifies the signature."""
        return any(key.verify(message, signature) for key in self._by_id.get(key_id, ()))

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._by_id

    def __iter__(self) -> Iterator[VerifierKey]:
        for group in self._by_id.values():
            yield from group

    def __len__(self) -> int:
        return sum(len(g) for g in self._by_id.values())


# -- cosigner keys (C2SP tlog-cosignature) ---------------------------------------------------------
#
# A witness signs cosignatures with its own key: Ed25519 (signature type 0x04) or, where the
# installed `cryptography` provides it, ML-DSA-44 (0x06). The key id commits to the type byte, so
# one key pair can never be taken for a log key (0x01) or for the other cosignature type. The
# private file form is the one of identity keys with the type byte in front of the seed:
# ``PRIVATE+KEY+<name>+<hex key id>+<base64(type || 32-byte seed)>``.

ED25519_COSIGNATURE_ALG = 0x04
MLDSA44_COSIGNATURE_ALG = 0x06
_COSIGNATURE_PUBLIC_BYTES = {ED25519_COSIGNATURE_ALG: 32, MLDSA44_COSIGNATURE_ALG: 1312}
COSIGNATURE_ALG_NAMES = {ED25519_COSIGNATURE_ALG: "ed25519", MLDSA44_COSIGNATURE_ALG: "ml-dsa-44"}


def typed_key_id(name: str, alg: int, public_key: bytes) -> bytes:
    """``SHA-256(name || 0x0A || type || public key)[:4]`` for any signature type byte."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()[:4]


def mldsa44_available() -> bool:
    """True when the installed ``cryptography`` can sign and verify ML-DSA-44."""
    try:
        importlib.import_module("cryptography.hazmat.primitives.asymmetric.mldsa")
    except ImportError:
        return False
    return True


def _mldsa_unavailable(where: str) -> KeyFileError:
    return KeyFileError(
        f"{where}: ML-DSA-44 needs a `cryptography` with ML-DSA support (46 or later), which is not installed",
        remedy="install a newer `cryptography`, or use an Ed25519 cosigner key",
        file=where,
    )


def _mldsa_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import mldsa

    try:
        mldsa.MLDSA44PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


class CosignerVerifier:
    """A cosigner's (witness's) public key: its name, signature type (0x04 or 0x06) and key bytes."""

    __slots__ = ("alg", "key_id", "name", "public_key")

    def __init__(self, name: str, alg: int, public_key: bytes) -> None:
        _check_name(name, "cosigner key")
        expected = _COSIGNATURE_PUBLIC_BYTES.get(alg)
        if expected is None:
            raise KeyFileError(
                f"cosigner key {name!r}: signature type 0x{alg:02x} is not a cosignature type (0x04 or 0x06)",
                remedy="give the witness's cosignature verifier key (Ed25519 type 04 or ML-DSA-44 type 06)",
                file="cosigner key",
            )
        if len(public_key) != expected:
            raise KeyFileError(
                f"cosigner key {name!r}: a type 0x{alg:02x} public key is {expected} bytes", file="cosigner key"
            )
        if alg == MLDSA44_COSIGNATURE_ALG and not mldsa44_available():
            raise _mldsa_unavailable(f"cosigner key {name!r}")
        self.name = name
        self.alg = alg
        self.public_key = public_key
        self.key_id = typed_key_id(name, alg, public_key).hex()

    @classmethod
    def parse(cls, text: str) -> CosignerVerifier:
        """Parse ``<name>+<hex key id>+<base64(type || public key)>``; the key id must match."""
        name, hex_id, raw = _public_key_fields(
            text,
            "cosigner key",
            "cosigner verifier key",
            "give the line `truss witness init` (or the witness's operator) printed",
        )
        if not raw:
            raise KeyFileError(f"cosigner key {name!r}: the key is empty", file="cosigner key")
        key = cls(name, raw[0], raw[1:])
        _check_key_id(key.key_id, hex_id, "cosigner key", name, "copy the whole line again from its source")
        return key

    @property
    def vkey(self) -> str:
        encoded = base64.b64encode(bytes([self.alg]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_id}+{encoded}"

    @property
    def algorithm(self) -> str:
        return COSIGNATURE_ALG_NAMES[self.alg]

    def verify(self, message: bytes, signature: bytes) -> bool:
        if self.alg == ED25519_COSIGNATURE_ALG:
            return _ed25519_verify(self.public_key, message, signature)
        return _mldsa_verify(self.public_key, message, signature)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CosignerVerifier) and (self.name, self.alg, self.public_key) == (
            other.name,
            other.alg,
            other.public_key,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.alg, self.public_key))

    def __repr__(self) -> str:
        return f"CosignerVerifier({self.name!r}, {self.algorithm}, {self.key_id})"


class CosignerKey:
    """A cosigner's private key (a witness's own key), Ed25519 or ML-DSA-44, from a 32-byte seed."""

    __slots__ = ("_seed", "_sign", "alg", "key_id", "name", "verifier")

    def __init__(self, name: str, alg: int, seed: bytes) -> None:
        _check_name(name, "cosigner key")
        if len(seed) != 32:
            raise KeyFileError("a cosigner key seed is 32 bytes", file="cosigner key")
        self._seed = seed
        if alg == ED25519_COSIGNATURE_ALG:
            public, secret = _ed25519_keypair(seed)

            def sign(message: bytes) -> bytes:
                return _ed25519_sign(secret, message)

        elif alg == MLDSA44_COSIGNATURE_ALG:
            if not mldsa44_available():
                raise _mldsa_unavailable(f"cosigner key {name!r}")
            from cryptography.hazmat.primitives.asymmetric import mldsa

            private = mldsa.MLDSA44PrivateKey.from_seed_bytes(seed)
            public = private.public_key().public_bytes_raw()

            def sign(message: bytes) -> bytes:
                return private.sign(message)

        else:
            raise KeyFileError(f"signature type 0x{alg:02x} is not a cosignature type", file="cosigner key")
        self._sign = sign
        self.name = name
        self.alg = alg
        self.verifier = CosignerVerifier(name, alg, public)
        self.key_id = self.verifier.key_id

    @classmethod
    def generate(cls, name: str, alg: int = ED25519_COSIGNATURE_ALG) -> CosignerKey:
        return cls(name, alg, os.urandom(32))

    @classmethod
    def from_seed(cls, seed: bytes, name: str, alg: int = ED25519_COSIGNATURE_ALG) -> CosignerKey:
        """A key from a known seed (test vectors; never for real use)."""
        return cls(name, alg, seed)

    @classmethod
    def create(cls, path: Path, name: str, alg: int = ED25519_COSIGNATURE_ALG) -> CosignerKey:
        """Generate a key and write it to ``path`` (mode 0600); refuses to overwrite a file."""
        key = cls.generate(name, alg)
        _write_private(path, key.private_text())
        return key

    @classmethod
    def load(cls, path: Path) -> CosignerKey:
        """Read a cosigner key file; refuses one that is missing, malformed, or readable by others."""
        text = _read_private(path)
        where = str(path)
        bad = KeyFileError(
            f"{where}: not a cosigner key (expected one line PRIVATE+KEY+<name>+<id>+<key>)",
            remedy="create one with `truss witness init`",
            file=where,
        )
        name, hex_id, raw = _private_key_fields(text, bad)
        if len(raw) != 33:
            raise bad
        key = cls(name, raw[0], raw[1:])
        _check_file_key_id(key.key_id, hex_id, where)
        return key

    def private_text(self) -> str:
        """The file form. Secret: write it only to a 0600 file."""
        encoded = base64.b64encode(bytes([self.alg]) + self._seed).decode()
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key_id}+{encoded}"

    def sign(self, message: bytes) -> bytes:
        return self._sign(message)

    def __repr__(self) -> str:
        return f"CosignerKey(name={self.name!r}, {COSIGNATURE_ALG_NAMES[self.alg]}, key_id={self.key_id!r})"


def _write_private(path: Path, text: str) -> None:
    # UTF-8 (a key name may be any Unicode), and atomic: the key is written and fsync'd under a
    # temporary name in the same directory, then linked into place, so a failure at any point
    # leaves either no file at ``path`` or the whole key; never a partial one that breaks every
    # later command. A hard link, not a rename, so that a key another process created meanwhile
    # is refused rather than replaced (a rename where the file system has no hard links).
    data = (text + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    exists = KeyFileError(
        f"{path}: a key file already exists",
        remedy="use the existing key, or move it away first if you really mean to replace it",
        file=str(path),
    )
    if os.path.lexists(path):
        raise exists
    import tempfile  # only when a key is written: verifying never loads it (start-up)

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise exists from None
        except OSError:
            if os.path.lexists(path):
                raise exists from None
            os.rename(tmp, path)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)


def _unwritable(path: Path, exc: OSError) -> KeyFileError:
    return KeyFileError(
        f"{path}: cannot write the key ({exc.strerror or type(exc).__name__}); no key file was left",
        remedy="free space or fix the directory's permissions, then run the command again",
        file=str(path),
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_private(path: Path) -> str:
    try:
        info = path.stat()
    except FileNotFoundError as exc:
        raise KeyFileError(f"{path}: no key file", remedy="create it first", file=str(path)) from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{path}: the key is readable or writable by group or others (mode {stat.S_IMODE(info.st_mode):03o})",
            remedy=f"restrict it with `chmod 600 {path}`",
            file=str(path),
        )
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read the key ({type(exc).__name__})", file=str(path)) from exc


def write_identity_key(path: Path, key: IdentityKey) -> None:
    """Write ``key`` to a new file ``path`` (mode 0600, fsync'd); refuses to overwrite a file."""
    _write_private(path, key.private_text())
