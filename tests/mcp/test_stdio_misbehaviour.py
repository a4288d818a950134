"""Misbehaving stdio servers: each gives a clear error naming server and tool, within its timeout,
and leaves no process behind."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import contract_from, new_store
from tests.mcp._util import RAW, alive, contract_of, group_members, raw_server
from truss._clock import SystemClock
from truss._errors import PinMismatchError, ServerStartError, ToolCallError
from truss.mcp import _stderr
from truss.mcp.client import connect
from truss.runtime import Runtime
from truss.session import run_contract

pytestmark = pytest.mark.anyio

CLOCK = SystemClock()


async def _start_error(tmp_path: Path, server: dict[str, object]) -> ServerStartError:
    with anyio.fail_after(20):
        with pytest.raises(ServerStartError) as info:
            async with connect(contract_of(server), log_dir=tmp_path, clock=CLOCK):
                pass
    return info.value


async def _call_error(
    tmp_path: Path, mode: str, tool: str = "echo", timeout_s: float = 5.0
) -> tuple[ToolCallError, int]:
    contract = contract_of(raw_server("bad", mode, allow=[tool]))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            pid = mounts.pids()["bad"]
            with pytest.raises(ToolCallError) as info:
                await mounts.call(mounts.tools[f"mcp:bad:{tool}"], {"text": "x"}, timeout_s=timeout_s)
    assert not group_members(pid)
    return info.value, pid


async def test_server_that_exits_at_start_is_a_start_error_naming_it(tmp_path: Path) -> None:
    error = await _start_error(tmp_path, raw_server("quitter", "exit_at_start"))
    assert error.server == "quitter"
    assert error.cause == "connection_closed"


async def test_bad_command_is_a_start_error_naming_the_command(tmp_path: Path) -> None:
    error = await _start_error(tmp_path, {"name": "nope", "command": "/nonexistent/mcp-server", "allow_tools": ["x"]})
    assert error.server == "nope"
    assert error.command == "/nonexistent/mcp-server"
    assert error.cause == "transport"


async def test_a_tool_list_larger_than_one_message_may_be_over_its_pages_is_a_start_error(tmp_path: Path) -> None:
    # Regression: pages were bounded one by one (16 MiB) and counted (1,000), so one listing could
    # hold 16 GB of tool definitions in memory before the run began.
    error = await _start_error(tmp_path, raw_server("bad", "huge_listing", allow=["echo"]))
    assert (error.server, error.cause) == ("bad", "protocol_error")


async def test_silent_server_fails_at_its_connect_timeout(tmp_path: Path) -> None:
    server = raw_server("mute", "silent", connect_timeout="1s")
    error = await _start_error(tmp_path, server)
    assert error.server == "mute"
    assert error.cause == "timeout"


async def test_crash_mid_call_is_connection_closed_naming_server_and_tool(tmp_path: Path) -> None:
    error, _ = await _call_error(tmp_path, "crash")
    assert (error.server, error.tool, error.cause) == ("bad", "echo", "connection_closed")
    assert error.retryable


async def test_call_never_answered_times_out_at_the_given_timeout(tmp_path: Path) -> None:
    error, _ = await _call_error(tmp_path, "never_answers", timeout_s=0.5)
    assert (error.server, error.tool, error.cause) == ("bad", "echo", "timeout")


async def test_non_json_answer_times_out_and_says_the_server_wrote_garbage(tmp_path: Path) -> None:
    error, _ = await _call_error(tmp_path, "garbage", timeout_s=0.5)
    assert (error.server, error.tool, error.cause) == ("bad", "echo", "timeout")
    assert error.garbage_lines == 1


async def test_non_utf8_answer_times_out_and_says_the_server_wrote_garbage(tmp_path: Path) -> None:
    error, _ = await _call_error(tmp_path, "non_utf8", timeout_s=0.5)
    assert (error.server, error.tool, error.cause) == ("bad", "echo", "timeout")
    assert error.garbage_lines == 1


async def test_stderr_flood_goes_to_the_log_file_and_the_call_succeeds(tmp_path: Path) -> None:
    contract = contract_of(raw_server("loud", "flood_stderr"))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            result = await mounts.call(mounts.tools["mcp:loud:echo"], {"text": "hi"}, timeout_s=10)
    assert result.text == "hi"
    log = tmp_path / "loud.stderr.log"
    assert log.stat().st_size > 2_000_000


async def test_stderr_log_is_capped_and_the_rest_discarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stderr, "STDERR_LOG_CAP_BYTES", 100_000)
    contract = contract_of(raw_server("loud", "flood_stderr"))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            for _ in range(2):
                await mounts.call(mounts.tools["mcp:loud:echo"], {"text": "hi"}, timeout_s=10)
    text = (tmp_path / "loud.stderr.log").read_text()
    assert 100_000 < len(text) < 100_200
    assert text.endswith("the rest is discarded]\n")


async def test_verbose_echoes_server_stderr_prefixed_and_without_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    contract = contract_of(raw_server("shouty", "escapes"))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK, verbose=True) as mounts:
            await mounts.call(mounts.tools["mcp:shouty:echo"], {"text": "x"}, timeout_s=5)
    err = capsys.readouterr().err
    assert "[shouty] starting ?[31mred?[0m" in err
    assert "\x1b" not in err
    assert "\x1b[31m" in (tmp_path / "shouty.stderr.log").read_text()


@pytest.mark.slow
async def test_ten_megabyte_result_is_refused_as_an_error_result(tmp_path: Path) -> None:
    contract = contract_of(raw_server("huge", "big_result", allow=["big"]), budget={"max_result_bytes": 1_000_000})
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            result = await mounts.call(mounts.tools["mcp:huge:big"], {}, timeout_s=20)
    assert result.is_error
    assert result.extra["refused"] == "max_result_bytes"
    assert result.extra["result_bytes"] > 1_000_000 and result.extra["partial"]  # refused as it arrived
    assert len(result.canonical_bytes()) < 1000


@pytest.mark.slow
async def test_a_ten_megabyte_result_is_recorded_as_a_result_too_large_failure(tmp_path: Path) -> None:
    store, key = new_store(tmp_path)
    contract = contract_from(f"""
[contract]
name = "huge"
intent = "ask for too much"
[budget]
max_result_bytes = 1000000
[[agent.steps]]
tool = "mcp:huge:big"
arguments = {{}}
[[mcp.servers]]
name = "huge"
command = {json.dumps(sys.executable)}
args = [{json.dumps(RAW)}, "big_result"]
allow_tools = ["big"]
""")
    with anyio.fail_after(60):
        await run_contract(
            Runtime(store=store, key=key, clock=CLOCK, home=tmp_path, environ={}, connector=connect),
            contract,
            session_id="s1",
        )
    [result] = [e for e in store.read_session("s1") if e.kind == "mcp_tool_call"]
    assert result.body["failure"] == {"cause": "result_too_large", "retryable": False}
    assert result.body["is_error"] is True


async def test_meta_is_stripped_from_results(tmp_path: Path) -> None:
    contract = contract_of(raw_server("ok", "ok"))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            result = await mounts.call(mounts.tools["mcp:ok:echo"], {"text": "hi"}, timeout_s=5)
    assert "_meta" not in result.wire
    assert result.wire == {"content": [{"type": "text", "text": "hi"}], "isError": False}


async def test_description_changed_after_listing_refuses_the_tool_with_both_pins(tmp_path: Path) -> None:
    contract = contract_of(raw_server("shifty", "mutate", allow=["echo", "mutate"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            echo = mounts.tools["mcp:shifty:echo"]
            assert (await mounts.call(echo, {"text": "a"}, timeout_s=5)).text == "a"
            await mounts.call(mounts.tools["mcp:shifty:mutate"], {}, timeout_s=5)
            await mounts.wait_relisted("shifty", 1)
            with pytest.raises(PinMismatchError) as info:
                await mounts.call(echo, {"text": "b"}, timeout_s=5)
    error = info.value
    assert (error.server, error.tool, error.expected) == ("shifty", "echo", echo.pin)
    assert error.actual is not None and error.actual != echo.pin


async def test_explicit_relist_reports_a_changed_pin(tmp_path: Path) -> None:
    contract = contract_of(raw_server("shifty", "mutate", allow=["echo", "mutate"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            assert await mounts.relist() == {}
            await mounts.call(mounts.tools["mcp:shifty:mutate"], {}, timeout_s=5)
            changed = await mounts.relist("shifty")
    assert list(changed) == ["mcp:shifty:echo"]


async def test_relisting_a_server_whose_pages_hold_new_names_each_time_keeps_state_for_the_latest_listing_only(
    tmp_path: Path,
) -> None:
    # Regression: the SDK's session keeps per-tool state (output schemas, validators, header maps)
    # for every tool of a paginated listing and prunes it only after a one-page listing, so a
    # server that says its tools changed and lists new names each time grew it for the whole run.
    contract = contract_of(raw_server("fresh", "fresh_pages", allow=["echo"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            for _ in range(5):
                await mounts.relist("fresh")
            session: Any = mounts._lives["fresh"].client.session  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess]
            held = set(session._tool_output_schemas)
            assert (await mounts.call(mounts.tools["mcp:fresh:echo"], {"text": "a"}, timeout_s=5)).text == "a"
    assert "echo" in held and "gen6_0" in held
    assert len(held) == 5 + 200, sorted(held)[:5]  # the last listing's tools, not six listings' 1,200


async def test_odd_tool_names_are_filtered_under_wildcard_and_mapped_safely(tmp_path: Path) -> None:
    contract = contract_of(raw_server("odd", "names", allow=["*"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            status = mounts.servers["odd"]
            provider = dict(mounts.by_provider_name)
            long_name = "x" * 80
            assert f"mcp:odd:{long_name}" in mounts.tools
    assert {status.filtered[n] for n in ["héllo", "two words", "a:b", "a/b"]} == {"invalid_name"}
    assert all(len(p) <= 64 for p in provider)
    assert provider[mounts.tools[f"mcp:odd:{long_name}"].provider_name] == f"mcp:odd:{long_name}"


async def test_explicitly_allowlisted_invalid_tool_name_is_a_start_error(tmp_path: Path) -> None:
    error = await _start_error(tmp_path, raw_server("odd", "names", allow=["two words"]))
    assert (error.server, error.tool, error.cause) == ("odd", "two words", "invalid_tool_name")


@pytest.mark.slow
async def test_grandchild_of_a_lingering_server_is_ended_with_its_group(tmp_path: Path) -> None:
    contract = contract_of(raw_server("linger", "grandchild"))
    with anyio.fail_after(30):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            pid = mounts.pids()["linger"]
            await mounts.call(mounts.tools["mcp:linger:echo"], {"text": "x"}, timeout_s=5)
            members = group_members(pid)
            assert len(members) >= 2
    assert not any(alive(p) for p in members)


@pytest.mark.slow
async def test_cancelled_run_ends_every_server_group(tmp_path: Path) -> None:
    contract = contract_of(raw_server("a", "grandchild"), raw_server("b", "ok"))
    pids: dict[str, int] = {}
    members: list[int] = []
    with anyio.fail_after(30):
        with anyio.CancelScope() as scope:
            async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
                pids.update(mounts.pids())
                await mounts.call(mounts.tools["mcp:a:echo"], {"text": "x"}, timeout_s=5)
                members.extend(group_members(pids["a"]))
                scope.cancel()
                await anyio.sleep_forever()
    assert set(pids) == {"a", "b"}
    assert not any(alive(p) for p in [*members, *pids.values()])


async def test_exception_in_the_run_ends_every_server_and_propagates_unwrapped(tmp_path: Path) -> None:
    contract = contract_of(raw_server("a", "ok"), raw_server("b", "ok"))
    pids: dict[str, int] = {}
    with anyio.fail_after(20), pytest.raises(KeyError):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            pids.update(mounts.pids())
            raise KeyError("boom")
    assert len(pids) == 2
    assert not any(alive(p) for p in pids.values())


async def test_one_failing_server_stops_the_others_and_names_itself(tmp_path: Path) -> None:
    contract = contract_of(raw_server("good", "ok"), raw_server("bad", "exit_at_start"))
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    assert info.value.server == "bad"
    assert not [p for p in _children() if alive(p)]


def _children() -> list[int]:
    me = os.getpid()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                found.append(int(entry))
    return found


async def test_dead_server_refuses_later_calls_without_hanging(tmp_path: Path) -> None:
    contract = contract_of(raw_server("bad", "crash", allow=["echo", "add"]))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as mounts:
            with pytest.raises(ToolCallError):
                await mounts.call(mounts.tools["mcp:bad:echo"], {"text": "x"}, timeout_s=5)
            with pytest.raises(ToolCallError) as info:
                await mounts.call(mounts.tools["mcp:bad:add"], {"a": 1, "b": 2}, timeout_s=5)
    assert (info.value.tool, info.value.cause) == ("add", "connection_closed")
