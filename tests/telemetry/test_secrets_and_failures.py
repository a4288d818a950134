"""What telemetry must never do: leak a secret, change a run, or hold it up; and what it loses, it reports.

Every test runs `truss run` as a subprocess against real servers (the wire-level tools server over
stdio, the SDK's HTTP server behind a bearer check) and a real OTLP/HTTP receiver, or a port where
nothing listens.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.telemetry.conftest import (
    TIMEOUT,
    require_otel_extra,
    run_json,
    telemetry_config,
    tools_contract,
    truss,
    write_config,
)

require_otel_extra()
from tests.telemetry.receiver import Receiver, receiver  # noqa: E402 - after the check that the extra is here

pytestmark = pytest.mark.slow

HTTP_SERVER = REPO / "tests" / "mcp" / "servers" / "http_modern.py"
CANARY_ENV = "canary-env-7f3a9c21d4"
CANARY_ARG = "canary-arg-19d2b6e08f"
CANARY_BEARER = "canary-bearer-5e8b03aa71"
CANARY_OTLP = "canary-otlp-c4d1e9f730"

THREE_CALLS = """
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "one" }
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "two" }
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "three" }
"""


@pytest.fixture
def http_mcp_server() -> Iterator[str]:
    """The SDK's Streamable HTTP test server on 127.0.0.1, requiring ``Bearer CANARY_BEARER``."""
    process = subprocess.Popen(
        [sys.executable, str(HTTP_SERVER), CANARY_BEARER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the server prints PORT=<n> once it listens
        assert line.startswith("PORT="), line
        yield f"http://127.0.0.1:{int(line.strip().split('=', 1)[1])}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def test_a_canary_secret_in_secret_env_a_secret_header_or_secret_args_reaches_no_span(
    tmp_path: Path, home: Path, otlp: Receiver, http_mcp_server: str
) -> None:
    # The strongest case: the operator asked for arguments and results, and the collector wants a token.
    otlp.require_header = ("authorization", f"Bearer {CANARY_OTLP}")
    extra = (
        "record_arguments = true\nrecord_results = true\n"
        'headers = { authorization = { secret_env = "OTLP_TOKEN", format = "Bearer {}" } }\n'
    )
    write_config(home, telemetry_config(otlp.endpoint, extra))
    steps = """
[[agent.steps]]
tool = "mcp:tools:has_env"
arguments = { name = "CANARY_TOKEN" }
[[agent.steps]]
tool = "mcp:tools:echo"
arguments = { text = "${env.CANARY_TOKEN}" }
[[agent.steps]]
tool = "mcp:tools:write"
arguments = { path = "/srv/key", text = "${env.CANARY_SECRET_ARG}" }
[[agent.steps]]
tool = "mcp:web:echo"
arguments = { text = "over http" }
"""
    web = f"""
[[mcp.servers]]
name = "web"
transport = "http"
url = "{http_mcp_server}"
headers = {{ Authorization = {{ secret_env = "CANARY_BEARER", format = "Bearer {{}}" }} }}
allow_tools = ["echo"]
"""
    contract = tools_contract(tmp_path, steps, server_extra='secret_env = ["CANARY_TOKEN"]\nsecret_args = ["text"]\n')
    contract.write_text(contract.read_text(encoding="utf-8") + web, encoding="utf-8")
    env = {
        "CANARY_TOKEN": CANARY_ENV,
        "CANARY_SECRET_ARG": CANARY_ARG,
        "CANARY_BEARER": CANARY_BEARER,
        "OTLP_TOKEN": CANARY_OTLP,
    }
    outcome = run_json(home, contract, env=env)
    assert outcome["status"] == "pass"
    spans = otlp.spans()
    assert outcome["telemetry"]["exported"] == len(spans) == 1 + 5 + 4  # the collector took every span
    calls = {
        s["attributes"]["gen_ai.tool.call.id"]: s["attributes"]
        for s in spans
        if "gen_ai.tool.call.id" in s["attributes"]
    }
    assert calls["c1.0"]["gen_ai.tool.call.result"]  # content was exported: the secrets were still kept out
    assert json.loads(calls["c2.0"]["gen_ai.tool.call.arguments"]) == {"text": "[redacted]"}
    assert calls["c4.0"]["truss.server.name"] == "web" and calls["c4.0"]["truss.call.outcome"] == "ok"
    sent = b"".join(r.body for r in otlp.requests) + json.dumps(spans).encode()
    for canary in (CANARY_ENV, CANARY_ARG, CANARY_BEARER, CANARY_OTLP):
        assert canary.encode() not in sent
    assert {r.headers.get("authorization") for r in otlp.requests} == {f"Bearer {CANARY_OTLP}"}


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_collector_changes_neither_the_outcome_nor_the_record_and_the_loss_is_reported(
    tmp_path: Path, home: Path
) -> None:
    contract = tools_contract(tmp_path, THREE_CALLS)
    without = run_json(home, contract)
    write_config(home, telemetry_config(f"http://127.0.0.1:{_closed_port()}", 'timeout = "2s"\n'))
    done = truss(home, "--json", "run", str(contract))
    assert done.returncode == 0, done.stderr
    with_dead = json.loads(done.stdout)
    assert (with_dead["status"], with_dead["exit_code"], with_dead["verdict"]) == (
        without["status"], without["exit_code"], without["verdict"],
    )  # fmt: skip
    stats = with_dead["telemetry"]
    assert stats["offered"] == 1 + 4 + 3 and stats["exported"] == 0
    assert stats["failed"] + stats["unsent"] == stats["offered"] and stats["last_error"]
    assert any(line.startswith("truss: telemetry: ") for line in done.stderr.splitlines())
    verify = truss(home, "ledger", "verify", with_dead["session"])
    assert verify.returncode == 0, verify.stderr


def test_a_collector_that_never_answers_holds_up_neither_the_calls_nor_the_end_of_the_run(
    tmp_path: Path, home: Path
) -> None:
    held = threading.Event()
    # Every request waits (up to a minute) without an answer; the run must finish well before that.
    with receiver(hold=held, hold_s=TIMEOUT * 2) as stuck:
        extra = 'schedule_delay = "10ms"\nmax_batch_spans = 1\nshutdown_timeout = "1s"\ntimeout = "60s"\n'
        write_config(home, telemetry_config(stuck.endpoint, extra))
        outcome = run_json(home, tools_contract(tmp_path, THREE_CALLS))  # bounded by the subprocess timeout
        held.set()
    assert outcome["status"] == "pass"
    stats = outcome["telemetry"]
    assert stats["exported"] == 0 and stats["offered"] == 1 + 4 + 3
    assert stats["unsent"] + stats["dropped"] + stats["failed"] == stats["offered"] and stats["unsent"] >= 1


def test_a_full_queue_drops_spans_counts_every_one_and_says_so(tmp_path: Path, home: Path) -> None:
    held = threading.Event()
    with receiver(hold=held, hold_s=TIMEOUT * 2) as stuck:
        extra = 'max_queue_spans = 2\nmax_batch_spans = 1\nschedule_delay = "10ms"\nshutdown_timeout = "1s"\n'
        write_config(home, telemetry_config(stuck.endpoint, extra))
        done = truss(home, "--json", "run", str(tools_contract(tmp_path, THREE_CALLS)))
        held.set()
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["telemetry"]
    assert stats["dropped"] >= 1
    assert (
        stats["exported"] + stats["dropped"] + stats["failed"] + stats["unsent"] + stats["rejected"] == stats["offered"]
    )
    assert any(line.startswith("truss: telemetry: ") for line in done.stderr.splitlines())
