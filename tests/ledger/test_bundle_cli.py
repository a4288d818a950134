"""`truss ledger export|checkpoint|verdict` and `verify --bundle|--since`, run as a user runs them."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import truss_cmd
from tests.ledger.test_bundle import OTHER_SESSION, VERDICT_SESSION, build_ledger
from truss.ledger.keys import IdentityKey

TAMPERED = Path(__file__).parent / "tampered_bundles"


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRUSS_HOME=str(home))
    return subprocess.run([*truss_cmd(), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.fixture
def home(truss_home: Path) -> Path:
    """A home whose identity key signed a ledger of two finished sessions."""
    key_file = truss_home / "identity.key"
    key = IdentityKey.create(key_file, name="bundles.truss.test")
    built = build_ledger(truss_home / "ledger.db", key=key)
    built.store.close()
    return truss_home


def vkey(home: Path) -> str:
    return IdentityKey.load(home / "identity.key").verifier.vkey


def test_export_then_verify_offline_with_only_the_verifier_key(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "session.bundle.json"
    exported = run(home, "ledger", "export", VERDICT_SESSION, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    assert json.loads(out.read_bytes())["session"] == VERDICT_SESSION
    # An auditor elsewhere: an empty home, only the file and the verifier key.
    auditor = tmp_path / "auditor"
    auditor.mkdir()
    checked = run(auditor, "--json", "ledger", "verify", "--bundle", str(out), "--trusted-key", vkey(home))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["verdict"] == "pass" and report["entries"] == 9


def test_export_without_payloads_writes_no_blobs_to_stdout(home: Path) -> None:
    exported = run(home, "ledger", "export", OTHER_SESSION, "--no-payloads")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["blobs"] == {}


def test_a_tampered_bundle_exits_1_and_names_the_step(home: Path, tmp_path: Path) -> None:
    fixture = TAMPERED / "payload_changed.json"
    trusted = (TAMPERED / "original.json").read_text()
    key = json.loads(trusted)["vkey"]
    checked = run(tmp_path, "--json", "ledger", "verify", "--bundle", str(fixture), "--trusted-key", key)
    assert checked.returncode == 1
    report = json.loads(checked.stdout)
    assert (report["step"], report["reason"]) == ("B4", "blob_mismatch")
    assert "Traceback" not in checked.stderr


def test_an_unreadable_bundle_exits_2_without_a_traceback(tmp_path: Path) -> None:
    key = json.loads((TAMPERED / "original.json").read_text())["vkey"]
    checked = run(tmp_path, "ledger", "verify", "--bundle", str(TAMPERED / "not_json.json"), "--trusted-key", key)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr
    missing = run(tmp_path, "ledger", "verify", "--bundle", str(tmp_path / "absent.json"), "--trusted-key", key)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_a_checkpoint_holding_a_lone_surrogate_exits_2_with_one_paragraph(tmp_path: Path) -> None:
    key = json.loads((TAMPERED / "original.json").read_text())["vkey"]
    fixture = TAMPERED / "checkpoint_holding_a_lone_surrogate.json"
    checked = run(tmp_path, "ledger", "verify", "--bundle", str(fixture), "--trusted-key", key)
    assert checked.returncode == 2, checked.stderr
    assert "lone surrogate" in checked.stdout and "Traceback" not in checked.stderr
    as_json = run(tmp_path, "--json", "ledger", "verify", "--bundle", str(fixture), "--trusted-key", key)
    assert as_json.returncode == 2 and "Traceback" not in as_json.stderr


def test_checkpoint_then_since_proves_the_log_was_only_extended(home: Path, tmp_path: Path) -> None:
    saved = tmp_path / "checkpoint.note"
    signed = run(home, "--json", "ledger", "checkpoint", "-o", str(saved))
    assert signed.returncode == 0, signed.stderr
    assert json.loads(signed.stdout)["note"] == saved.read_text()
    since = run(home, "--json", "ledger", "verify", "--since", str(saved))
    assert since.returncode == 0, since.stdout + since.stderr
    assert json.loads(since.stdout)["ok"]


def test_since_fails_on_a_log_rewritten_by_the_key_holder(home: Path, tmp_path: Path) -> None:
    saved = tmp_path / "checkpoint.note"
    assert run(home, "ledger", "checkpoint", "-o", str(saved)).returncode == 0
    # The key holder rebuilds the ledger with one entry of another session changed, and re-signs.
    key = IdentityKey.load(home / "identity.key")
    (home / "ledger.db").unlink()
    for suffix in ("-wal", "-shm"):
        (home / f"ledger.db{suffix}").unlink(missing_ok=True)
    build_ledger(home / "ledger.db", key=key, rewrite_other=True).store.close()
    since = run(home, "--json", "ledger", "verify", "--since", str(saved))
    assert since.returncode == 1
    assert json.loads(since.stdout)["reason"] in ("fork", "inconsistent")


def test_verdict_prints_the_envelope_and_verifies_it(home: Path) -> None:
    shown = run(home, "--json", "ledger", "verdict", VERDICT_SESSION)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["verified"] and doc["envelope"]["payloadType"] == "application/vnd.in-toto+json"
    assert doc["statement"]["subject"][0]["name"] == f"truss-session:{VERDICT_SESSION}"


def test_verdict_under_a_key_that_is_not_trusted_exits_1(home: Path) -> None:
    stranger = IdentityKey.generate("bundles.truss.test").verifier.vkey
    shown = run(home, "ledger", "verdict", VERDICT_SESSION, "--trusted-key", stranger)
    assert shown.returncode == 1 and "Traceback" not in shown.stderr


def test_verify_all_includes_the_merkle_checks(home: Path) -> None:
    checked = run(home, "--json", "ledger", "verify", "--all")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_verify_all_fails_when_the_stored_merkle_tree_was_altered(home: Path) -> None:
    with closing(sqlite3.connect(home / "ledger.db")) as conn, conn:
        conn.execute("UPDATE nodes SET hash = ? WHERE last = 7 AND level = 3", (b"\x09" * 32,))
    checked = run(home, "--json", "ledger", "verify", "--all")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["reason"] == "node_mismatch"  # the altered interior node itself is named (L1)


def test_a_bundle_whose_envelope_has_fields_dsse_does_not_define_verifies(truss_home: Path) -> None:
    from tests.ledger.test_bundle import log_key

    bundle = Path(__file__).parents[1] / "report" / "tampered" / "envelope_with_unrecognized_fields.json"
    done = run(truss_home, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", log_key().verifier.vkey)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_exported_bundle_is_canonical_json_and_a_newline_and_verify_takes_any_json_spelling(
    home: Path, tmp_path: Path
) -> None:
    from truss.ledger.canonical import canonical

    out = tmp_path / "session.bundle.json"
    assert run(home, "ledger", "export", VERDICT_SESSION, "-o", str(out)).returncode == 0
    data = out.read_bytes()
    assert data == canonical(json.loads(data)) + b"\n"
    stdout = run(home, "ledger", "export", VERDICT_SESSION)
    assert stdout.stdout.encode("utf-8") == data
    spellings = {
        "without_the_newline": data[:-1],
        "indented": json.dumps(json.loads(data), indent=2).encode("utf-8"),
        "with_a_utf8_bom": b"\xef\xbb\xbf" + data,
    }
    for name, spelled in spellings.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(spelled)
        checked = run(home, "ledger", "verify", "--bundle", str(path), "--trusted-key", vkey(home))
        assert checked.returncode == 0, f"{name}: {checked.stdout}{checked.stderr}"
