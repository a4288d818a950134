"""What serve-mcp refuses: contract names that are paths, budget widening, bad params, other
principals' sessions, oversized and over-nested requests. In-process (``Client(server)``) where
the property lives in the server; the transports have their own tests."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, types
from mcp.server.streamable_http import EventMessage

from tests.conftest import truss_cmd
from tests.serve.conftest import HERE, Site, error_of, structured, text_of
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.mcp._serve_backend import LedgerBackend
from truss.mcp._serve_core import Principal, TokenTable, json_depth, resolve_contract
from truss.mcp._serve_http import RecentEvents
from truss.mcp.server import ServeConfig, ServeLimits, serve_app
from truss.runtime import Runtime
from truss.testing import ManualClock

pytestmark = pytest.mark.anyio

ALICE = Principal("acme", "alice")
BOB = Principal("acme", "bob")
NAMES: dict[str, list[str]] = {
    k: v for k, v in json.loads((HERE / "abuse" / "contract_names.json").read_text()).items() if not k.startswith("_")
}


@asynccontextmanager
async def apps(site: Site, *principals: Principal, limits: ServeLimits | None = None) -> AsyncGenerator[list[Client]]:
    """One client per principal, each on its own ServeApp over one shared ledger (as on one server)."""
    key = IdentityKey.load(site.home / "identity.key")
    clock = SystemClock()
    store = open_store(site.home / "ledger.db", key=key, clock=clock)
    backend = LedgerBackend(Runtime(store=store, key=key, clock=clock, home=site.home, environ=site.env))
    config = ServeConfig(
        contracts_dir=site.contracts, home=site.home, backend=backend, clock=clock, limits=limits or ServeLimits()
    )
    try:
        async with AsyncExitStack() as stack:
            clients: list[Client] = []
            for principal in principals:
                app = await stack.enter_async_context(serve_app(config, _fixed(principal)))
                clients.append(await stack.enter_async_context(Client(app.server, cache=None)))
            yield clients
    finally:
        store.close()


def _fixed(principal: Principal) -> Any:
    def principal_of(ctx: Any) -> Principal:
        return principal

    return principal_of


@pytest.mark.parametrize("attack", sorted(NAMES))
async def test_a_contract_name_that_is_a_path_is_refused(serve_site: Site, attack: str) -> None:
    name, reason = NAMES[attack]
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            result = await client.call_tool("truss_run_contract", {"contract": name})
    error = error_of(result)
    assert error["kind"] == "bad_input"
    assert error["reason"] == reason
    assert "\x00" not in text_of(result)
    assert not list((serve_site.home / "logs").iterdir())


async def test_a_symlink_leading_out_of_the_contracts_dir_is_refused(serve_site: Site, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.toml"
    outside.write_text((serve_site.contracts / "hello.toml").read_text())
    (serve_site.contracts / "escape.toml").symlink_to(outside)
    with pytest.raises(Exception) as caught:
        resolve_contract(serve_site.contracts, "escape")
    assert getattr(caught.value, "reason", None) == "outside_dir"
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            result = await client.call_tool("truss_run_contract", {"contract": "escape"})
            unknown = await client.call_tool("truss_run_contract", {"contract": "no-such-contract"})
    assert error_of(result)["reason"] == "outside_dir"
    assert error_of(unknown)["kind"] == "not_found"


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        ({"max_tool_calls": 1000}, "max_tool_calls"),
        ({"deadline": "2h"}, "deadline"),
        ({"max_result_bytes": 10**9}, "max_result_bytes"),
    ],
)
async def test_a_budget_can_only_narrow_the_contracts_limits(
    serve_site: Site, budget: dict[str, Any], field: str
) -> None:
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            result = await client.call_tool("truss_run_contract", {"contract": "hello", "budget": budget})
    error = error_of(result)
    assert error["kind"] == "bad_input"
    assert error["key"] == field


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"contract": "hello", "params": {"target_zone": 42}}, "bad_contract"),
        ({"contract": "hello", "params": {"target_zone": "Bad Zone!"}}, "bad_contract"),
        ({"contract": "hello", "params": {"not_declared": "x"}}, "bad_contract"),
        ({"contract": "hello", "params": {"target_zone": {"nested": 1}}}, "bad_input"),
        ({"contract": "hello", "params": "target_zone=UTC"}, "bad_input"),
        ({"contract": "hello", "budget": {"max_tool_calls": "lots"}}, "bad_input"),
        ({"contract": "hello", "budget": {"max_tokens": 2**53}}, "bad_input"),  # no limit to narrow, but unrecordable
        ({"contract": "hello", "budget": {"policy": "allow"}}, "bad_input"),
        ({"contract": "hello", "unexpected": True}, "bad_input"),
        ({"contract": "hello", "async": "yes"}, "bad_input"),
        ({"contract": 7}, "bad_input"),
        ({}, "bad_input"),
    ],
)
async def test_params_and_arguments_of_the_wrong_shape_are_refused(
    serve_site: Site, arguments: dict[str, Any], expected: str
) -> None:
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            result = await client.call_tool("truss_run_contract", arguments)
    assert error_of(result)["kind"] in {expected, "usage"}
    assert not list((serve_site.home / "logs").iterdir())


@pytest.mark.parametrize(
    "value",
    [2**53, -(2**53), 2**64, 1e20, 2.0**53],
    ids=["int_at_2_53", "int_at_minus_2_53", "u64", "1e20", "double_2_53"],
)
async def test_a_param_number_the_ledger_cannot_record_is_refused_before_anything_runs(
    serve_site: Site, value: float
) -> None:
    # The caller's params are recorded in session_started: a number outside I-JSON's range would
    # have no canonical form there, so it is refused as a bad param, not an internal error.
    text = (serve_site.contracts / "hello.toml").read_text(encoding="utf-8")
    params = '[contract.params]\nn = { type = "number", default = 1 }\n'
    text = text.replace('name = "hello"', 'name = "numbers"', 1).replace("[contract.params]\n", params, 1)
    (serve_site.contracts / "numbers.toml").write_text(text, encoding="utf-8")
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            result = await client.call_tool("truss_run_contract", {"contract": "numbers", "params": {"n": value}})
    assert error_of(result)["kind"] == "bad_contract"
    assert not list((serve_site.home / "logs").iterdir())


async def test_another_principals_session_answers_exactly_like_an_unknown_one(
    serve_site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", serve_site.env["PATH"])  # the contract names mcp-server-time by bare name
    with anyio.fail_after(90):
        async with apps(serve_site, ALICE, BOB) as [alice, bob]:
            mine = structured(await alice.call_tool("truss_run_contract", {"contract": "hello", "session_id": "k1"}))
            assert mine["status"] == "pass"
            for tool in ("truss_contract_status", "truss_ledger_verdict", "truss_ledger_export"):
                theirs = await bob.call_tool(tool, {"session": mine["session"]})
                unknown = await bob.call_tool(tool, {"session": "s_nosuchsession"})
                assert error_of(theirs)["kind"] == error_of(unknown)["kind"] == "not_found"
                assert text_of(theirs).replace(mine["session"], "X") == text_of(unknown).replace("s_nosuchsession", "X")
            # Bob repeating Alice's key or her session id gets a run of his own, never hers.
            bobs = structured(await bob.call_tool("truss_run_contract", {"contract": "hello", "session_id": "k1"}))
            by_id = structured(
                await bob.call_tool("truss_run_contract", {"contract": "hello", "session_id": mine["session"]})
            )
            assert bobs["session"] != mine["session"] and by_id["session"] != mine["session"]
            status = structured(await alice.call_tool("truss_contract_status", {"session": mine["session"]}))
            assert status["status"] == "pass"


async def test_a_request_nested_past_the_limit_is_a_protocol_error(serve_site: Site) -> None:
    deep: Any = "x"
    for _ in range(40):
        deep = {"d": deep}
    with anyio.fail_after(30):
        async with apps(serve_site, ALICE) as [client]:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("truss_run_contract", {"contract": "hello", "params": {"deep": deep}})
    assert caught.value.code == -32600


def test_nesting_depth_is_counted_without_recursion() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep, 32) == 33
    assert json_depth({"a": [1, {"b": 2}]}, 32) == 3


async def test_the_sse_replay_buffer_holds_at_most_its_byte_bound_of_large_answers() -> None:
    # Regression: the buffer was bounded by its count of events alone (10,000), and each kept the
    # message object; a caller asking for a bundle of up to --max-answer-bytes again and again made
    # serve-mcp hold thousands of them, gigabytes, for replays nobody might ask for.
    bound = 1_048_576
    events = RecentEvents(ManualClock(), max_bytes=bound)
    answer = {"bundle": "x" * 100_000}
    ids = [await events.store_event("7", types.JSONRPCResponse(jsonrpc="2.0", id=7, result=answer)) for _ in range(30)]
    assert events.held_bytes <= bound
    replayed: list[Any] = []

    async def send(event: EventMessage) -> None:
        replayed.append(event)

    with anyio.fail_after(10):
        assert await events.replay_events_after(ids[0], send) is None  # long gone: an unknown event id
        assert await events.replay_events_after(ids[-4], send) == "7"
    assert [e.event_id for e in replayed] == ids[-3:]
    assert all(isinstance(e.message, types.JSONRPCResponse) and e.message.result == answer for e in replayed)


def test_a_token_maps_to_its_principal_only_by_its_hash(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "tokens.toml"
    path.write_text(f'[[tokens]]\nhash = "sha256:{hashlib.sha256(b"s3cret").hexdigest()}"\ntenant = "t"\nuser = "u"\n')
    path.chmod(0o600)
    table = TokenTable.load(path)
    assert table.principal_for_header("Bearer s3cret") == Principal("t", "u")
    for header in (None, "", "Bearer", "Bearer s3cre", "Basic s3cret", "Bearer s3cret2", "s3cret"):
        assert table.principal_for_header(header) is None


@pytest.mark.parametrize(
    "text",
    [
        '[[tokens]]\nhash = "s3cret"\ntenant = "t"\nuser = "u"\n',  # a plain token instead of its hash
        '[[tokens]]\nhash = "sha256:' + "0" * 64 + '"\ntenant = "t"\n',  # no user
        '[[tokens]]\nhash = "sha256:' + "0" * 64 + '"\ntenant = "../t"\nuser = "u"\n',  # bad principal
        "tokens = []\n",
        "not toml at all [",
    ],
)
def test_a_malformed_tokens_file_is_refused(tmp_path: Path, text: str) -> None:
    from truss._errors import UsageError

    path = tmp_path / "tokens.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(UsageError):
        TokenTable.load(path)


async def test_a_suspended_session_resumes_only_for_its_own_principal_after_approval(
    serve_site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", serve_site.env["PATH"])
    with anyio.fail_after(120):
        async with apps(serve_site, ALICE, BOB) as [alice, bob]:
            first = structured(await alice.call_tool("truss_run_contract", {"contract": "asks", "session_id": "r1"}))
            assert first["status"] == "suspended" and first["waiting"]
            session = first["session"]
            approve = [*truss_cmd(), "--home", str(serve_site.home), "approve", session, first["waiting"][0]]
            done = await anyio.run_process(approve, env=serve_site.env, check=False)
            assert done.returncode == 0, done.stderr
            # Bob naming Alice's session gets a session of his own; hers stays untouched.
            bobs = structured(await bob.call_tool("truss_run_contract", {"contract": "asks", "session_id": session}))
            assert bobs["session"] != session and bobs["status"] == "suspended"
            resumed = structured(await alice.call_tool("truss_run_contract", {"contract": "asks", "session_id": "r1"}))
    assert resumed["session"] == session
    assert resumed["status"] == "pass", resumed


async def test_an_export_over_the_answer_limit_is_referenced_not_inlined(
    serve_site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    monkeypatch.setenv("PATH", serve_site.env["PATH"])
    with anyio.fail_after(90):
        async with apps(serve_site, ALICE, limits=ServeLimits(max_answer_bytes=1024)) as [client]:
            run = structured(await client.call_tool("truss_run_contract", {"contract": "hello"}))
            first = structured(await client.call_tool("truss_ledger_export", {"session": run["session"]}))
            again = structured(await client.call_tool("truss_ledger_export", {"session": run["session"]}))
    assert first["inline"] is False and first["bundle"] is None
    path = anyio.Path(first["path"])
    assert path.parent == anyio.Path(serve_site.home / "exports")
    data = await path.read_bytes()
    assert len(data) == first["bytes"] > 1024
    assert first["sha256"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert again == first
    assert (await path.stat()).st_mode & 0o077 == 0
