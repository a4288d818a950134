"""Identity and verifier keys: file mode, C2SP vkey form and key ids, rotation through the trusted set."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from truss._errors import KeyFileError
from truss.ledger.keys import IdentityKey, TrustedKeys, VerifierKey


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
