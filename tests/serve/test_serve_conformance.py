"""The official MCP conformance suite (server mode) against ``serve-mcp --transport http``.

Runs ``conformance/run.py`` for both spec versions: the suite and its mock servers live in a
fresh network namespace with only ``lo`` up. Only the fixture-dependent checks listed (with
their reasons) in ``conformance/expected-failures-<version>.yml`` may fail; a check that starts
passing makes the baseline stale and fails too. Skipped, with the reason, where network
namespaces are not permitted or the suite is not installed (``make peers``); under CI any reason
not to run the suite fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, peers_path_env

pytestmark = pytest.mark.slow

SKIP = 77


@pytest.mark.parametrize(
    ("spec_version", "extension"), [("2025-11-25", None), ("2026-07-28", None), ("2026-07-28", "tasks")]
)
def test_the_protocol_level_conformance_scenarios_pass(spec_version: str, extension: str | None) -> None:
    more = ["--extension", extension] if extension else []
    done = subprocess.run(
        [sys.executable, str(REPO / "conformance" / "run.py"), "--spec-version", spec_version, *more],
        capture_output=True,
        text=True,
        env=peers_path_env(),
        timeout=900,
        check=False,
    )
    if done.returncode == SKIP:
        reason = done.stderr.strip().splitlines()[-1]
        if os.environ.get("CI"):
            pytest.fail(reason)  # as tests/conftest.py does for peers: a green CI means the suite ran
        pytest.skip(reason)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, tail
