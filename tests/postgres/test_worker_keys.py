"""Many workers, many keys on one PostgreSQL ledger: ``truss`` in subprocesses, a real server.

The log key's home creates the ledger and runs the checkpoint publisher; a worker home joins with
its own identity key (``init --join``), the log key admits it (``ledger keys add-worker``), and both
record runs into the one log. Verification from either home follows the key statements in ``@log``
from the log key: a worker's entries verify from its admission until its removal, never outside it,
and only the log key's checkpoints count. A writer that skips the store's key-set guard (an old or
hostile process with database access) is simulated by opening the store with the guard patched out.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Generator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, truss_cmd
from tests.durability.support import counting_contract, make_home
from tests.durability.support import truss as truss_env
from truss._clock import SystemClock
from truss._errors import StoreError
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.stores import LedgerStore, open_store

pytestmark = pytest.mark.slow  # each test runs `truss` in subprocesses


def _ok(proc: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


class Deployment:
    """The log key's home (the ledger in TRUSS_DB) and worker homes joined to it."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp, self.url = tmp_path, url
        self.log_home = make_home(tmp_path / "log")
        self.env = {"TRUSS_DB": url}
        _ok(truss_env(self.log_home, "init", env=self.env))
        shown = json.loads(_ok(truss_env(self.log_home, "--json", "key", "show")).stdout)
        self.log_vkey: str = shown["vkey"]
        self.contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")

    def log(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        return _ok(truss_env(self.log_home, *args, env=self.env), code)

    def join(self, name: str) -> tuple[Path, dict[str, object]]:
        home = self.tmp / name
        joined = json.loads(
            _ok(truss_env(home, "--json", "init", "--join", self.url, "--log-key", self.log_vkey)).stdout
        )
        return home, joined

    def admit(self, joined: dict[str, object]) -> None:
        self.log("ledger", "keys", "add-worker", str(joined["vkey"]), str(joined["proof"]))

    @contextmanager
    def publisher(self) -> Generator[None]:
        environ = dict(os.environ, TRUSS_HOME=str(self.log_home), **self.env)
        proc = subprocess.Popen(
            [*truss_cmd(), "ledger", "checkpoint", "--every", "100ms"],
            env=environ,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            yield
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        assert "Traceback" not in err


def _verify_all(home: Path, *, code: int = 0, env: dict[str, str] | None = None) -> dict[str, object]:
    proc = _ok(truss_env(home, "--json", "ledger", "verify", "--all", env=env), code)
    return json.loads(proc.stdout)


def _always(value: bool) -> Any:
    def check(conn: Any, key: IdentityKey) -> bool:
        return value

    return check


@contextmanager
def _rogue_store(monkeypatch: pytest.MonkeyPatch, url: str, key: IdentityKey) -> Generator[LedgerStore]:
    """The ledger opened with ``key`` by a writer that skips the key-set guard."""
    import truss.ledger.stores.postgresql as pg

    with monkeypatch.context() as patch:
        patch.setattr(pg, "key_in_set", _always(True))
        patch.setattr(pg, "key_retired", _always(False))
        with closing(open_store(url, key=key, clock=SystemClock())) as store:
            yield store


def test_two_homes_with_their_own_keys_write_one_postgresql_ledger_and_either_verifies_it_all(
    tmp_path: Path, postgres_url: str
) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    worker, joined = deployment.join("worker")
    assert joined["admitted"] is False and joined["vkey"] != deployment.log_vkey
    assert "db" in (worker / "config.toml").read_text(encoding="utf-8")
    deployment.admit(joined)
    deployment.admit(joined)  # admitting again changes nothing
    with deployment.publisher():
        deployment.log("run", str(deployment.contract), "--session", "s-log")
        run = json.loads(_ok(truss_env(worker, "--json", "run", str(deployment.contract), "--session", "s-w")).stdout)
    assert run["status"] == "pass"

    from_log = _verify_all(deployment.log_home, env=deployment.env)
    from_worker = _verify_all(worker)
    assert from_log["ok"] and from_worker["ok"] and from_log["entries"] == from_worker["entries"]
    worker_key = IdentityKey.load(worker / "identity.key")
    with closing(open_store(postgres_url, key=None, clock=SystemClock(), create=False)) as store:
        signers = {e.keyid for e in store.read_session("s-w")}
        assert signers == {worker_key.key_id}, "the worker signed its own entries"
        log_key = IdentityKey.load(deployment.log_home / "identity.key")
        assert {e.keyid for e in store.read_session("s-log")} == {log_key.key_id}
        for checkpoint in store.checkpoints():
            assert f"— {log_key.name} " in checkpoint.note and checkpoint.note.count("\n— ") == 1
    keys = json.loads(deployment.log("--json", "ledger", "keys", "list").stdout)["periods"]
    assert [(p["vkey"], p["role"], p["until_index"]) for p in keys] == [
        (deployment.log_vkey, "log", None),
        (joined["vkey"], "worker", None),
    ]
    verdict = json.loads(_ok(truss_env(worker, "--json", "ledger", "verdict", "s-w")).stdout)
    assert verdict["verified"] and verdict["statement"]["predicate"]["status"] == "pass"
    bundle = tmp_path / "s-w.bundle.json"
    _ok(truss_env(worker, "ledger", "export", "s-w", "--output", str(bundle)))
    offline = _ok(
        truss_env(tmp_path, "ledger", "verify", "--bundle", str(bundle), "--trusted-key", deployment.log_vkey)
    )
    assert "Traceback" not in offline.stderr  # the bundle carries the admission: the log key alone verifies it


def test_a_worker_the_log_key_did_not_admit_cannot_record_and_its_forced_entries_do_not_verify(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    worker, joined = deployment.join("stranger")
    refused = _ok(truss_env(worker, "run", str(deployment.contract), "--session", "s-x"), code=2)
    assert "not in the key set" in refused.stderr and "add-worker" in refused.stderr
    assert json.loads(deployment.log("--json", "sessions").stdout)["sessions"] == []
    assert _verify_all(deployment.log_home, env=deployment.env)["ok"]

    with _rogue_store(monkeypatch, postgres_url, IdentityKey.load(worker / "identity.key")) as store:
        store.append("s-forced", [Record("session_started", {"contract": "forced"})])
    report = _verify_all(deployment.log_home, code=1, env=deployment.env)
    assert report["ok"] is False and report["session"] == "s-forced"
    assert _verify_all(worker, code=1)["ok"] is False, "the worker's own home refuses it too"
    assert str(joined["vkey"]) not in json.dumps(json.loads(deployment.log("--json", "ledger", "keys", "list").stdout))


def test_a_workers_entries_verify_only_between_its_admission_and_its_removal(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    worker, joined = deployment.join("worker")
    worker_key = IdentityKey.load(worker / "identity.key")
    with _rogue_store(monkeypatch, postgres_url, worker_key) as store:
        store.append("s-early", [Record("session_started", {"contract": "early"})])
    deployment.admit(joined)
    early = _verify_all(deployment.log_home, code=1, env=deployment.env)
    assert early["session"] == "s-early" and early["reason"] == "retired_key", early  # before its admission

    with closing(open_store(postgres_url, key=deployment_key(deployment), clock=SystemClock())) as store:
        bad = [e for e in store.read_session("s-early")]
    assert len(bad) == 1  # still there: the record is append-only; verification names it
    deployment.log("ledger", "keys", "remove-worker", str(joined["vkey"]))
    after = _ok(truss_env(worker, "run", str(deployment.contract), "--session", "s-late"), code=2)
    assert "removed from the key set" in after.stderr
    with _rogue_store(monkeypatch, postgres_url, worker_key) as store:
        with pytest.raises(StoreError) as refused:  # a process opened before the removal: refused on append
            store.append("s-late", [Record("session_started", {"contract": "late"})])
        assert refused.value.fields.get("reason") == "key_retired"
        import truss.ledger.stores._pg_writer as writer

        with monkeypatch.context() as patch:  # and one that skips that check too
            patch.setattr(
                writer, "KEY_RETIRED", "SELECT 1 WHERE %s::text IS NULL AND %s::text IS NULL AND %s::bytea IS NULL"
            )
            late = store.append("s-late", [Record("session_started", {"contract": "late"})])
    keys = json.loads(deployment.log("--json", "ledger", "keys", "list").stdout)["periods"]
    assert keys[1]["role"] == "worker" and keys[1]["until_index"] is not None
    assert late[0].index >= keys[1]["until_index"]
    # Only the entries after the removal are refused now: drop the early forged one from the picture
    # by verifying the late session alone, then the whole log.
    single = _ok(truss_env(deployment.log_home, "--json", "ledger", "verify", "s-late", env=deployment.env), 1)
    assert json.loads(single.stdout)["reason"] == "retired_key"
    assert _verify_all(worker, code=1)["ok"] is False


def deployment_key(deployment: Deployment) -> IdentityKey:
    return IdentityKey.load(deployment.log_home / "identity.key")


def test_a_checkpoint_signed_by_a_worker_key_does_not_verify(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    worker, joined = deployment.join("worker")
    deployment.admit(joined)
    with deployment.publisher():
        _ok(truss_env(worker, "run", str(deployment.contract), "--session", "s-w"))
    assert _verify_all(deployment.log_home, env=deployment.env)["ok"]
    worker_key = IdentityKey.load(worker / "identity.key")
    with closing(open_store(postgres_url, key=worker_key, clock=SystemClock())) as store:
        store.append("s-more", [Record("session_started", {"contract": "more"})])
        size, root = store.tree_head()
        forged = sign_checkpoint_note(store.origin, size, root, worker_key)
        assert forged.note is not None
        store.add_checkpoint(size, root, forged.note.decode())
    report = _verify_all(deployment.log_home, code=1, env=deployment.env)
    assert report["ok"] is False


def test_joining_with_a_log_key_of_another_log_or_without_a_ledger_is_refused(
    tmp_path: Path, postgres_url: str, postgres_urls: Callable[[], str]
) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    stranger = IdentityKey.generate("truss.test/another-log").verifier.vkey
    wrong = _ok(truss_env(tmp_path / "w1", "init", "--join", postgres_url, "--log-key", stranger), code=2)
    assert "is the log" in wrong.stderr and not (tmp_path / "w1" / "identity.key").exists()
    empty = _ok(truss_env(tmp_path / "w2", "init", "--join", postgres_urls(), "--log-key", deployment.log_vkey), 2)
    assert "no ledger" in empty.stderr
    alone = _ok(truss_env(tmp_path / "w3", "init", "--join", postgres_url), code=2)
    assert "--log-key" in alone.stderr
    itself = _ok(truss_env(deployment.log_home, "init", "--join", postgres_url, "--log-key", deployment.log_vkey), 2)
    assert "log key itself" in itself.stderr


def test_the_publisher_refuses_a_duration_that_is_not_one_and_a_workers_home(tmp_path: Path, postgres_url: str) -> None:
    deployment = Deployment(tmp_path, postgres_url)
    for bad in ("0", "soon", "-1s"):
        proc = deployment.log("ledger", "checkpoint", "--every", bad, code=2)
        assert "--every" in proc.stderr
    deployment.log("ledger", "checkpoint", "--every", "1s", "--witness", code=2)
    worker, joined = deployment.join("worker")
    deployment.admit(joined)
    refused = _ok(truss_env(worker, "ledger", "checkpoint", "--every", "1s"), code=2)
    assert "worker key" in refused.stderr
