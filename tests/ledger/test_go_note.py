"""Go's ``golang.org/x/mod/sumdb/note`` (the reference signed-note implementation) still opens every
Truss checkpoint with its Ed25519 log signature once witnesses' cosignature lines are added.

Built offline from the Debian packages ``golang-go`` and ``golang-golang-x-mod-dev`` (``make test``
installs them when run as root). Under CI the test must run; elsewhere it is skipped, with the
install hint, only when Go or x/mod is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ledger._witness_keys import ORIGIN, log_key, witness_key
from truss.ledger.cosignature import cosign, with_signature_lines
from truss.ledger.keys import MLDSA44_COSIGNATURE_ALG, mldsa44_available
from truss.ledger.merkle import MemoryTree
from truss.ledger.note import parse_note, sign_checkpoint_note

PROGRAM = Path(__file__).parent / "go_note" / "main.go"
GOPATHS = [p for p in (os.environ.get("TRUSS_GOPATH"), "/usr/share/gocode") if p]
HINT = "install Go and x/mod: `apt-get install golang-go golang-golang-x-mod-dev` (or set TRUSS_GOPATH)"


def _gopath() -> str | None:
    for path in GOPATHS:
        if (Path(path) / "src" / "golang.org" / "x" / "mod" / "sumdb" / "note" / "note.go").exists():
            return path
    return None


@pytest.fixture(scope="module")
def go_note(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go, gopath = shutil.which("go"), _gopath()
    if go is None or gopath is None:
        if os.environ.get("CI"):
            pytest.fail(f"Go's sumdb/note is needed under CI: {HINT}")
        pytest.skip(f"Go's sumdb/note is not installed: {HINT}")
    work = tmp_path_factory.mktemp("go")
    env = dict(
        os.environ,
        GO111MODULE="off",
        GOPATH=f"{work / 'gopath'}{os.pathsep}{gopath}",
        GOCACHE=str(work / "cache"),
        GOFLAGS="",
        GOPROXY="off",
        CGO_ENABLED="0",
    )
    binary = work / "go_note"
    command = [go, "build", "-o", str(binary), str(PROGRAM)]
    build = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr
    return binary


def _open(binary: Path, vkey: str, note: bytes, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "checkpoint.note"
    path.write_bytes(note)
    return subprocess.run([str(binary), vkey, str(path)], capture_output=True, text=True, timeout=60, check=False)


def test_go_opens_a_truss_checkpoint_with_cosignature_lines_and_verifies_the_log_signature(
    go_note: Path, tmp_path: Path
) -> None:
    tree = MemoryTree()
    for i in range(11):
        tree.append(b"entry %d" % i)
    key = log_key()
    note = sign_checkpoint_note(ORIGIN, tree.size, tree.root(), key).note
    assert note is not None
    text = parse_note(note).text
    cosigners = [witness_key("w1"), witness_key("w2")]
    if mldsa44_available():
        cosigners.append(witness_key("w-pq", alg=MLDSA44_COSIGNATURE_ALG))
    cosigned = with_signature_lines(note, [cosign(text, w, 1_700_000_000 + i) for i, w in enumerate(cosigners)])
    opened = _open(go_note, key.verifier.vkey, cosigned, tmp_path)
    assert opened.returncode == 0, opened.stderr
    result = json.loads(opened.stdout)
    assert result["text"] == text
    assert result["verified"] == [ORIGIN]
    assert result["unverified"] == [w.name for w in cosigners], "cosignatures are kept as unknown signatures"


def test_go_refuses_the_same_note_once_a_byte_of_its_text_changes(go_note: Path, tmp_path: Path) -> None:
    key = log_key()
    note = sign_checkpoint_note(ORIGIN, 3, bytes(32), key).note
    assert note is not None
    tampered = note.replace(b"\n3\n", b"\n4\n", 1)
    assert _open(go_note, key.verifier.vkey, tampered, tmp_path).returncode == 1
