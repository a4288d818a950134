"""The signal pattern (``[[mcp.servers.async]]`` + ``truss signal``) and the cross-run memo."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.durability.support import cli, counting_contract, entries, invocations, kinds, make_home, truss
from tests.gate.support import contract_from, new_store
from truss.contract import Server
from truss.mcp.client import connect
from truss.mcp.launch import Launch, Report
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import ManualClock

ASYNC = """
[[mcp.servers.async]]
tool = "deploy"
pending = { pointer = "/status", equals = "pending" }
signal = "/job"
"""


@pytest.mark.slow
def test_a_pending_result_suspends_until_truss_signal_delivers_the_result(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    contract = counting_contract(
        tmp_path, steps=[("mcp:cnt:deploy", {"name": "web"})], check_tool="mcp:cnt:deploy", server=ASYNC
    )
    with (tmp_path / "durable.toml").open("a", encoding="utf-8") as f:
        f.write(
            '[[done.checks]]\nkind = "result_matches"\ntool = "mcp:cnt:deploy"\npointer = "/url"\nregex = "^https://"\n'
        )
    run = truss(home, "run", str(contract), "--session", "s1")
    assert run.returncode == 3, run.stdout + run.stderr
    assert "truss signal s1" in run.stdout
    pending = [e for e in entries(home, "s1") if e.kind == "mcp_tool_pending"]
    assert len(pending) == 1 and pending[0].body["signal"] == "job-web" and pending[0].body["kind"] == "signal"

    early = truss(home, "resume", "s1")
    assert early.returncode == 3 and "job-web" in early.stderr  # nothing to resume with yet

    wrong = cli(home, "signal", "s1", "job-nope", "--payload", "{}")
    assert wrong.returncode == 2 and "job-web" in wrong.stderr
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"status": "done", "url": "https://web.example"}), encoding="utf-8")
    delivered = cli(home, "signal", "s1", "job-web", "--payload", f"@{payload}")
    assert delivered.returncode == 0, delivered.stderr

    resumed = truss(home, "resume", "s1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert invocations(tmp_path) == {"deploy web": 1}
    recorded = kinds(home, "s1")
    assert recorded.index("mcp_tool_pending") < recorded.index("signal_received") < recorded.index("mcp_tool_call")
    assert cli(home, "ledger", "verify").returncode == 0
    assert cli(home, "replay", "s1").returncode == 0


def _memo_contract(directory: Path, ttl: str, *, calls: int = 1, budget: str = "") -> Path:
    return counting_contract(
        directory,
        steps=[("mcp:cnt:count", {"key": "k"})] * calls,
        check_tool="mcp:cnt:count",
        server=f'[[mcp.servers.tools]]\nname = "count"\nmemo = "{ttl}"\n',
        contract=budget,
    )


@pytest.mark.slow
def test_a_memo_hit_within_the_ttl_makes_no_server_call_and_a_miss_after_it_does(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    first = truss(home, "run", str(_memo_contract(tmp_path, "1h")), "--session", "a")
    assert first.returncode == 0, first.stdout + first.stderr
    second = truss(home, "run", str(_memo_contract(tmp_path, "1h")), "--session", "b")
    assert second.returncode == 0, second.stdout + second.stderr
    assert invocations(tmp_path) == {"count k": 1}
    [hit] = [e for e in entries(home, "b") if e.kind == "mcp_tool_call"]
    [original] = [e for e in entries(home, "a") if e.kind == "mcp_tool_call"]
    assert hit.body["replayed_from"] == {"session": "a", "seq": original.seq, "hash": original.hash}
    assert hit.body["result"] == original.body["result"] and "mcp_tool_intent" not in kinds(home, "b")

    # The same call with a TTL that has certainly passed since the first run: a miss, a live call.
    third = truss(home, "run", str(_memo_contract(tmp_path, "1ms")), "--session", "c")
    assert third.returncode == 0, third.stdout + third.stderr
    assert invocations(tmp_path) == {"count k": 2}
    assert cli(home, "ledger", "verify").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize(("charge", "denied"), [("true", 1), ("false", 0)])
def test_a_memo_hit_is_charged_against_the_call_budget_unless_the_contract_says_not(
    tmp_path: Path, charge: str, denied: int
) -> None:
    home = make_home(tmp_path / "home")
    budget = f"[budget]\nmax_tool_calls = 1\ncharge_memo_hits = {charge}\n"
    run = truss(home, "run", str(_memo_contract(tmp_path, "1h", calls=2, budget=budget)), "--session", "s")
    assert run.returncode == 0, run.stdout + run.stderr
    recorded = kinds(home, "s")
    assert recorded.count("mcp_tool_denied") == denied
    assert invocations(tmp_path) == {"count k": 1}


class _EnvLauncher:
    """Runs the server under ``env MEMO_TEST=1``: the same server declaration, reached another way."""

    def describe(self, server: Server) -> dict[str, Any]:
        return {"kind": "env-prefix"}

    @asynccontextmanager
    async def launch(self, server: Server, declared: Launch, report: Report) -> AsyncGenerator[Launch]:
        yield Launch("env", ("MEMO_TEST=1", declared.command, *declared.args), declared.env, declared.cwd)


@pytest.mark.anyio
async def test_a_memo_hit_needs_the_server_reached_the_same_way_not_only_declared_the_same(tmp_path: Path) -> None:
    clock = ManualClock()  # the store's clock too: the memo window is measured on the entries' times
    store, key = new_store(tmp_path, clock)
    contract = contract_from(_memo_contract(tmp_path, "1h").read_text(encoding="utf-8"))

    async def run(session: str, launcher: Any = None) -> None:
        connector = functools.partial(connect, launcher=launcher)
        with anyio.fail_after(60):
            outcome = await run_contract(
                Runtime(store=store, key=key, clock=clock, home=tmp_path, environ={}, connector=connector),
                contract,
                session_id=session,
            )
        assert outcome.status == "pass", outcome

    await run("plain")
    await run("launched", _EnvLauncher())  # a launcher (a sandbox, say) may change the answer: live
    assert invocations(tmp_path) == {"count k": 2}
    await run("again", _EnvLauncher())  # reached the same way as "launched": a hit
    assert invocations(tmp_path) == {"count k": 2}
    [hit] = [e for e in store.read_session("again") if e.kind == "mcp_tool_call"]
    assert hit.body["replayed_from"]["session"] == "launched"
