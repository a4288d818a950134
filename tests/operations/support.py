"""A shared SQLite ledger set up through ``truss`` in subprocesses, as an operator does: a log home,
and a worker home that joins it and is admitted by the log key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.durability.support import truss


def ok_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON a ``truss --json`` command printed, once it exited 0."""
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def init_log(home: Path, name: str) -> tuple[str, str]:
    """``truss init`` of the log home: the log key's vkey and the URL of its ledger a worker joins."""
    vkey = ok_json(truss(home, "--json", "init", "--name", name))["vkey"]
    return vkey, f"sqlite:///{home / 'ledger.db'}"


def join_and_admit(log_home: Path, worker_home: Path, url: str, log_vkey: str) -> dict[str, Any]:
    """``truss init --join`` of the worker home, then ``ledger keys add-worker`` by the log home:
    the worker's answer to its join (its ``vkey`` and ``proof``)."""
    worker = ok_json(truss(worker_home, "--json", "init", "--join", url, "--log-key", log_vkey))
    added = truss(log_home, "ledger", "keys", "add-worker", worker["vkey"], worker["proof"])
    assert added.returncode == 0, added.stdout + added.stderr
    return worker
