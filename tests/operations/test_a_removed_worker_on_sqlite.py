"""A worker removed from a shared SQLite ledger records nothing more: ``truss`` in subprocesses.

The regression: the SQLite store refused only keys a rotation retired, so a worker whose key the
log key had removed (``ledger keys remove-worker``) went on recording entries that ``ledger verify
--all`` then refused (``retired_key``), while PostgreSQL refused the worker before it wrote.
"""

from __future__ import annotations

from pathlib import Path

from tests.durability.support import counting_contract, truss
from tests.operations.support import init_log, join_and_admit, ok_json


def test_a_worker_removed_from_a_shared_sqlite_ledger_cannot_record_and_the_ledger_still_verifies(
    tmp_path: Path,
) -> None:
    log_home, worker_home = tmp_path / "log", tmp_path / "worker"
    log_vkey, url = init_log(log_home, "example.com/log")
    worker = join_and_admit(log_home, worker_home, url, log_vkey)
    removed = ok_json(truss(log_home, "--json", "ledger", "keys", "remove-worker", worker["vkey"]))
    assert removed["changed"] is True
    size = ok_json(truss(log_home, "--json", "ledger", "verify", "--all"))["entries"]

    contract = counting_contract(tmp_path, steps=[("mcp:cnt:count", {"key": "a"})], check_tool="mcp:cnt:count")
    late = truss(worker_home, "run", str(contract), "--session", "s-late")
    assert late.returncode == 2, late.stdout + late.stderr
    assert "removed from the key set" in late.stderr and "Traceback" not in late.stderr
    report = ok_json(truss(log_home, "--json", "ledger", "verify", "--all"))
    assert report["ok"] and report["entries"] == size, "the removed key signed nothing"
    assert ok_json(truss(log_home, "--json", "sessions"))["sessions"] == []
