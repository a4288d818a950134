"""``truss init --join``: whether this home is admitted is read from ``@log`` as the log key signed it."""

from __future__ import annotations

from pathlib import Path

from tests.durability.support import truss
from tests.operations.support import init_log, join_and_admit, ok_json
from truss._clock import SystemClock
from truss.ledger.entry import Record
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store

ORIGIN = "example.com/log"


def test_an_admission_written_into_the_shared_log_by_another_key_is_refused_not_shown_as_admitted(
    tmp_path: Path,
) -> None:
    log_home, stranger_home = tmp_path / "log", tmp_path / "stranger"
    log_vkey, url = init_log(log_home, ORIGIN)
    ok_json(truss(stranger_home, "--json", "init", "--name", ORIGIN))  # a key claiming the same log's name

    join_and_admit(log_home, tmp_path / "worker", url, log_vkey)
    assert (
        ok_json(truss(tmp_path / "worker", "--json", "init", "--join", url, "--log-key", log_vkey))["admitted"] is True
    )

    other = ok_json(truss(tmp_path / "other", "--json", "init", "--join", url, "--log-key", log_vkey))
    assert other["admitted"] is False
    forger = IdentityKey.load(stranger_home / "identity.key")
    store = open_store(str(log_home / "ledger.db"), key=forger, clock=SystemClock(), create=False)
    try:  # someone with write access to the shared store, but not the log key, admits a worker
        store.append("@log", [Record("key_admitted", {"key": other["vkey"]})])
    finally:
        store.close()

    again = truss(tmp_path / "other", "--json", "init", "--join", url, "--log-key", log_vkey)
    assert again.returncode == 1, again.stdout + again.stderr  # docs/cli.md: the key history does not verify
    assert '"admitted": true' not in again.stdout and "Traceback" not in again.stderr
    assert "@log" in again.stdout + again.stderr and "does not verify" in again.stdout + again.stderr
