"""The official MCP conformance suite in client mode, with Truss's client tier as the client under test.

Runs ``conformance/run.py --mode client`` for both revisions: ``conformance client --requirements
<revision>`` with ``conformance/client.py`` (which drives Truss through its CLI), inside a fresh
network namespace with only ``lo`` up. Every required scenario must pass except those listed, with
their reasons, in ``conformance/expected-failures-client-<revision>.yml`` (none today: the
``auth/*`` scenarios log in with ``truss mcp login``); a listed one that passes makes the baseline
stale and fails too; the not-scored extension scenarios run and are printed. Skipped, with the
reason, where network namespaces are not permitted; under CI any reason not to run the suite fails
(``make peers`` installs it; CI runs as root, where ``unshare --net`` is permitted).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, peers_path_env

SKIP = 77
DRIVER = REPO / "conformance" / "client.py"


@pytest.mark.slow
@pytest.mark.parametrize("revision", ["2025-11-25", "2026-07-28"])
def test_the_client_tier_passes_every_required_client_scenario_but_the_listed_ones(revision: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "conformance" / "run.py"), "--mode", "client", "--spec-version", revision],
        capture_output=True,
        text=True,
        env=peers_path_env(),
        timeout=2400,
        check=False,
    )
    if done.returncode == SKIP:
        reason = done.stderr.strip().splitlines()[-1]
        if os.environ.get("CI"):
            pytest.fail(reason)  # as tests/conftest.py does for peers: a green CI means the suite ran
        pytest.skip(reason)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
    assert done.returncode == 0, tail
    assert "Baseline check passed" in done.stdout, tail
    assert f"Not scored for {revision}" in done.stdout, tail  # the extension scenarios ran and were printed


def _driver(scenario: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MCP_CONFORMANCE_SCENARIO=scenario, MCP_CONFORMANCE_PROTOCOL_VERSION="2026-07-28")
    return subprocess.run(
        [sys.executable, str(DRIVER), "http://127.0.0.1:9/mcp"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_the_driver_fails_loudly_on_a_scenario_it_has_no_handler_for() -> None:
    done = _driver("a-scenario-nobody-wrote")
    assert done.returncode == 2
    assert "unknown scenario 'a-scenario-nobody-wrote'" in done.stderr and "tools_call" in done.stderr


def test_the_driver_fails_loudly_on_an_auth_scenario_for_a_capability_not_built() -> None:
    done = _driver("auth/dpop")  # DPoP is not built: no handler, never a silent pass
    assert done.returncode == 2
    assert "unknown scenario 'auth/dpop'" in done.stderr and "auth/metadata-default" in done.stderr
