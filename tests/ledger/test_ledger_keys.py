"""Identity and verifier keys: file mode, C2SP vkey form and key ids, rotation through the trusted set."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss._errors import KeyFileError
from truss.ledger.keys import CosignerKey, CosignerVerifier, IdentityKey, TrustedKeys, VerifierKey


def test_a_created_key_file_is_private_and_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    key = IdentityKey.create(path, "example.com/truss")
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = IdentityKey.load(path)
    assert loaded.verifier == key.verifier and loaded.name == "example.com/truss"
    assert loaded.sign(b"m") == key.sign(b"m")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_key_readable_by_group_or_others_is_refused_with_a_chmod_remedy(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "identity.key"
    IdentityKey.create(path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as info:
        IdentityKey.load(path)
    assert info.value.remedy is not None and "chmod 600" in info.value.remedy
    assert info.value.file == str(path)


def test_creating_over_an_existing_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    first = IdentityKey.create(path)
    with pytest.raises(KeyFileError):
        IdentityKey.create(path)
    assert IdentityKey.load(path).verifier == first.verifier


def test_a_missing_or_garbled_key_file_is_a_key_file_error_without_its_text(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError):
        IdentityKey.load(tmp_path / "absent.key")
    path = tmp_path / "garbled.key"
    path.write_text("PRIVATE+KEY+name+00000000+c2VjcmV0LXNlY3JldA==\n")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as info:
        IdentityKey.load(path)
    assert "c2VjcmV0" not in info.value.diagnostics()


def test_the_verifier_key_has_the_c2sp_form_and_key_id() -> None:
    key = IdentityKey.from_seed(bytes(32), "example.com/log")
    pub = key.verifier.public_key
    expected_id = hashlib.sha256(b"example.com/log\n\x01" + pub).digest()[:4].hex()
    encoded = base64.b64encode(b"\x01" + pub).decode()
    assert key.verifier.vkey == f"example.com/log+{expected_id}+{encoded}"
    assert VerifierKey.parse(key.verifier.vkey) == key.verifier


@pytest.mark.parametrize(
    "text",
    [
        "",
        "name+abcd",
        "name+00000000+AAAA",
        "na me+00000000+" + "A" * 44,
        "bad+ffffffff+" + base64.b64encode(b"\x01" + bytes(32)).decode(),
    ],
)
def test_malformed_verifier_keys_are_refused(text: str) -> None:
    with pytest.raises(KeyFileError):
        VerifierKey.parse(text)


def test_rotation_keeps_old_entries_verifiable_with_both_keys_trusted() -> None:
    old = IdentityKey.generate("example.com/log")
    new = IdentityKey.generate("example.com/log")
    trusted = TrustedKeys.from_texts([old.verifier.vkey, new.verifier.vkey])
    assert trusted.verify(old.key_id, b"m", old.sign(b"m"))
    assert trusted.verify(new.key_id, b"m", new.sign(b"m"))
    assert not trusted.verify(new.key_id, b"m", old.sign(b"m"))
    assert len(trusted) == 2 and old.key_id in trusted


def test_a_key_write_that_fails_before_it_is_durable_leaves_no_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "home" / "identity.key"

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(KeyFileError, match="No space left on device"):
        IdentityKey.create(path, "münchen.example/log")
    monkeypatch.undo()
    assert list(path.parent.iterdir()) == []
    key = IdentityKey.create(path, "münchen.example/log")
    assert IdentityKey.load(path).verifier == key.verifier


def test_signatures_are_rfc_8032_ed25519() -> None:
    # RFC 8032 section 7.1, TEST 2 (one-byte message).
    seed = bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
    public = bytes.fromhex("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")
    signature = bytes.fromhex(
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"
    )
    key = IdentityKey.from_seed(seed, "rfc8032.test")
    assert key.verifier.public_key == public
    assert key.sign(b"\x72") == signature
    assert key.verifier.verify(b"\x72", signature)
    assert not key.verifier.verify(b"\x73", signature)
    assert not key.verifier.verify(b"\x72", signature[:-1] + bytes([signature[-1] ^ 1]))
    assert not key.verifier.verify(b"\x72", signature[:63]), "a short signature does not verify"


@given(st.binary(min_size=32, max_size=32), st.binary(max_size=200))
def test_signing_and_verifying_agree_with_pynacl(seed: bytes, message: bytes) -> None:
    import nacl.signing

    key = IdentityKey.from_seed(seed, "agree.test")
    theirs = nacl.signing.SigningKey(seed)
    assert key.verifier.public_key == bytes(theirs.verify_key)
    assert key.sign(message) == theirs.sign(message).signature
    assert key.verifier.verify(message, theirs.sign(message).signature)


def test_a_generated_key_signs_what_its_verifier_accepts_and_two_keys_differ() -> None:
    one, two = IdentityKey.generate("one.test"), IdentityKey.generate("two.test")
    assert one.verifier.public_key != two.verifier.public_key
    signature = one.sign(b"m")
    assert one.verifier.verify(b"m", signature) and not two.verifier.verify(b"m", signature)
    assert IdentityKey._parse_private(one.private_text(), "test").verifier == one.verifier  # pyright: ignore[reportPrivateUsage]


_VKEY = IdentityKey.from_seed(bytes(32), "example.com/log").verifier.vkey
_COSIGNER_VKEY = CosignerKey.from_seed(bytes(32), "witness.example").verifier.vkey
_PRIVATE = IdentityKey.from_seed(bytes(32), "example.com/log").private_text()
_COSIGNER_PRIVATE = CosignerKey.from_seed(bytes(32), "witness.example").private_text()
_V, _C = VerifierKey.parse, CosignerVerifier.parse
_SHOW_LINE = "give the line `truss key show` prints: <name>+<hex key id>+<base64 key>"
_INIT_LINE = "give the line `truss witness init` (or the witness's operator) printed"
_RESTORE = "restore the key file from a backup"
_WITNESS_INIT = "create one with `truss witness init`"


def _other_id(line: str) -> str:
    """``line`` with its key id replaced by 00000000 (which a real key's id is not)."""
    prefix = "PRIVATE+KEY+" if line.startswith("PRIVATE+KEY+") else ""
    name, key_id, encoded = line.removeprefix(prefix).split("+", 2)
    assert key_id != "00000000"
    return f"{prefix}{name}+00000000+{encoded}"


@pytest.mark.parametrize(
    ("parse", "text", "remedy", "chained"),
    [
        (_V, "name+abcd", _SHOW_LINE, False),
        (_V, "name+00000000+AAA*", None, True),
        (_V, "name+00000000+AAAA", None, False),
        (_V, _other_id(_VKEY), "copy the whole line again from `truss key show`", False),
        (_C, "name+abcd", _INIT_LINE, False),
        (_C, "name+00000000+AAA*", None, True),
        (_C, "name+00000000+", None, False),
        (_C, _other_id(_COSIGNER_VKEY), "copy the whole line again from its source", False),
    ],
)
def test_each_refused_verifier_key_line_names_its_kind_and_gives_its_remedy(
    parse: Callable[[str], object], text: str, remedy: str | None, chained: bool
) -> None:
    with pytest.raises(KeyFileError) as info:
        parse(text)
    kind = "verifier key" if parse == _V else "cosigner key"
    assert (info.value.remedy, info.value.file) == (remedy, kind)
    assert isinstance(info.value.__cause__, binascii.Error) == chained, "a base64 error is chained to its cause"


@pytest.mark.parametrize(
    ("load", "text", "remedy"),
    [
        (IdentityKey.load, "PRIVATE+KEY+name+abcd", _RESTORE),
        (IdentityKey.load, "name+00000000+" + _PRIVATE.rsplit("+", 1)[1], _RESTORE),
        (IdentityKey.load, "PRIVATE+KEY+name+00000000+AAA*", _RESTORE),
        (IdentityKey.load, "PRIVATE+KEY+name+00000000+AAAA", _RESTORE),
        (IdentityKey.load, _other_id(_PRIVATE), None),
        (CosignerKey.load, "PRIVATE+KEY+name+abcd", _WITNESS_INIT),
        (CosignerKey.load, "PRIVATE+KEY+name+00000000+AAA*", _WITNESS_INIT),
        (CosignerKey.load, "PRIVATE+KEY+name+00000000+AAAA", _WITNESS_INIT),
        (CosignerKey.load, _other_id(_COSIGNER_PRIVATE), None),
    ],
)
def test_each_refused_private_key_file_names_the_file_and_never_echoes_the_key(
    tmp_path: Path, load: Callable[[Path], object], text: str, remedy: str | None
) -> None:
    path = tmp_path / "some.key"
    path.write_text(text + "\n")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as info:
        load(path)
    assert info.value.file == str(path)
    assert (info.value.remedy or "").startswith(remedy or "") and (remedy is None) == (info.value.remedy is None)
    assert text.rsplit("+", 1)[1] not in info.value.diagnostics()
    assert info.value.__cause__ is None, "the decoding error of a private key is not chained"
