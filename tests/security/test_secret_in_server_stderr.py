"""Attack (or accident): a server prints the secret Truss handed it (``secret_env``) to its
stderr, which Truss keeps in ``$TRUSS_HOME/logs``. The value must reach no file of the home, even
when a copy straddles two reads of the pipe, and ``--verbose`` must not echo it either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gate.support import files_containing
from tests.security._support import hostile_contract, truss
from tests.security.servers.hostile import COPIES

SECRET = "hostile-secret-7f3a9c2e-value"


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_server_printing_its_secret_env_to_stderr_leaves_no_copy_in_the_home(
    tmp_path: Path, home: Path, verbose: bool
) -> None:
    contract = hostile_contract(tmp_path, server_extra='secret_env = ["HOSTILE_TOKEN"]')
    flags = ["-v"] if verbose else []
    run = truss(home, *flags, "--json", "run", str(contract), env={"HOSTILE_TOKEN": SECRET})
    assert run.returncode == 0, run.stderr
    session = json.loads(run.stdout)["session"]

    assert files_containing(home, SECRET.encode()) == []
    assert SECRET not in run.stdout + run.stderr
    log = (home / "logs" / session / "hostile.stderr.log").read_text()
    # Every copy was written and replaced, none lost or half-kept at a read boundary.
    assert log.count("token=[redacted]\n") == COPIES
