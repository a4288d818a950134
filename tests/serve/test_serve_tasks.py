"""serve-mcp's native MCP Tasks (the 2026-07-28 Tasks extension) with the Python SDK client over stdio."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import Field

from tests.serve.conftest import Site, error_of, stdio_client_for, structured, text_of, truss_cmd
from truss._clock import SystemClock
from truss.ledger.keys import IdentityKey
from truss.ledger.stores import open_store
from truss.mcp._serve_backend import LedgerBackend
from truss.mcp._serve_core import Principal
from truss.mcp._serve_tasks import RUN_META, TASKS_EXTENSION
from truss.mcp.server import ServeConfig, ServeLimits, serve_app
from truss.runtime import Runtime

pytestmark = pytest.mark.anyio


class TaskHandle(types.Result):
    """The claimed ``CreateTaskResult`` (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"


class TaskState(types.Result):
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    created_at: str
    last_updated_at: str
    poll_interval_ms: int | None = None


async def _resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    with anyio.fail_after(60):
        while True:
            state = await ctx.session.send_request(GetTask(params=TaskIdParams(taskId=handle.task_id)), TaskState)
            if state.status == "completed" and state.result is not None:
                return types.CallToolResult.model_validate(state.result)
            await anyio.sleep(0.05)


class Tasks(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=_resolve)]


@asynccontextmanager
async def task_client(site: Site, *extra: str) -> AsyncGenerator[Client]:
    cmd = site.cmd(*extra)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=site.env)
    with (site.tmp / "serve-tasks.stderr.log").open("a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), extensions=[Tasks()], read_timeout_seconds=60,  # pyright: ignore[reportArgumentType]
                          cache=None) as client:  # fmt: skip
            yield client


async def start_task(client: Client, arguments: dict[str, Any]) -> TaskHandle:
    handle = await client.session.call_tool("truss_run_contract", arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    return handle


async def get(client: Client, task_id: str) -> TaskState:
    return await client.session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), TaskState)


async def poll_until(client: Client, task_id: str, done: Callable[[TaskState], bool]) -> TaskState:
    with anyio.fail_after(90):
        while True:
            state = await get(client, task_id)
            if done(state):
                return state
            await anyio.sleep(0.05)


async def test_a_task_mode_call_gets_a_task_id_at_once_and_polling_returns_the_verdict(serve_site: Site) -> None:
    flag = serve_site.flag("task-once")
    async with task_client(serve_site) as client:
        with anyio.fail_after(60):
            handle = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
        assert handle.status == "working" and handle.task_id.startswith("s_")
        # The run is held mid-call by the gate server: the task is working, and says what it is doing.
        state = await get(client, handle.task_id)
        assert state.status == "working"
        flag.touch()
        final = await poll_until(client, handle.task_id, lambda s: s.status == "completed")
        assert final.result is not None and final.result.get("isError") is False
        answer = final.result["structuredContent"]
        assert answer["session"] == handle.task_id and answer["status"] == "pass"
        # The SDK's claim resolver polls transparently: call_tool then returns the CallToolResult.
        flag.touch()
        with anyio.fail_after(60):
            result = await client.call_tool("truss_run_contract", {"contract": "gated", "params": {"flag": str(flag)}})
        assert not result.is_error and (result.structured_content or {})["status"] == "pass"


async def test_a_suspended_delegated_run_is_reported_as_waiting_for_approval(serve_site: Site) -> None:
    async with task_client(serve_site) as client:
        with anyio.fail_after(60):
            handle = await start_task(client, {"contract": "asks"})
        state = await poll_until(client, handle.task_id, lambda s: RUN_META in (s.meta or {}))
        assert state.status == "working"
        assert "approval" in (state.status_message or "") and f"truss approve {handle.task_id}" in (
            state.status_message or ""
        )
        run = (state.meta or {}).get(RUN_META)
        assert run is not None and run["status"] == "suspended" and run["waiting_on"] == "approval"
        assert run["waiting"]


async def test_cancelling_a_queued_task_stops_it_before_it_starts_and_records_nothing(serve_site: Site) -> None:
    flag = serve_site.flag("task-cancel")
    async with task_client(serve_site, "--max-concurrent-runs", "1") as client:
        with anyio.fail_after(60):
            first = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
            second = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
        queued = await get(client, second.task_id)
        assert queued.status == "working" and (queued.status_message or "").startswith("queued")
        await client.session.send_request(CancelTask(params=TaskIdParams(taskId=second.task_id)), types.EmptyResult)
        cancelled = await get(client, second.task_id)
        assert cancelled.status == "cancelled"
        flag.touch()
        done = await poll_until(client, first.task_id, lambda s: s.status == "completed")
        assert done.result is not None and done.result["structuredContent"]["status"] == "pass"
        # Nothing of the cancelled task reached the ledger.
        status = await client.call_tool("truss_contract_status", {"session": second.task_id})
        assert error_of(status)["kind"] == "not_found"


async def test_cancelling_after_the_run_started_lets_it_finish_and_tells_the_truth(serve_site: Site) -> None:
    flag = serve_site.flag("task-late-cancel")
    async with task_client(serve_site) as client:
        with anyio.fail_after(60):
            handle = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
        await client.session.send_request(CancelTask(params=TaskIdParams(taskId=handle.task_id)), types.EmptyResult)
        state = await get(client, handle.task_id)
        assert state.status == "working" and "runs to its verdict" in (state.status_message or "")
        flag.touch()
        done = await poll_until(client, handle.task_id, lambda s: s.status == "completed")
        assert done.result is not None and done.result["structuredContent"]["status"] == "pass"
        assert "cancellation was asked after the run started" in (done.status_message or "")


async def test_a_task_of_another_principal_or_an_unknown_id_is_an_unknown_task(serve_site: Site) -> None:
    async with task_client(serve_site) as client:
        with anyio.fail_after(30), pytest.raises(Exception) as raised:
            await get(client, "s_nosuchtask")
        assert "unknown task" in str(raised.value)


async def test_a_client_without_the_extension_keeps_the_synchronous_answer(serve_site: Site) -> None:
    flag = serve_site.flag("no-ext")
    flag.touch()
    async with stdio_client_for(serve_site) as client:
        with anyio.fail_after(60):
            result = await client.call_tool("truss_run_contract", {"contract": "gated", "params": {"flag": str(flag)}})
        assert not result.is_error and (result.structured_content or {})["status"] == "pass"


async def test_the_task_methods_refuse_a_caller_that_did_not_declare_the_extension(serve_site: Site) -> None:
    async with stdio_client_for(serve_site) as client:
        with anyio.fail_after(30), pytest.raises(MCPError) as raised:
            await client.session.send_request(GetTask(params=TaskIdParams(taskId="s_any")), TaskState)
        assert raised.value.error.code == -32021


async def test_a_run_refused_by_a_quota_is_an_is_error_naming_the_quota_and_when_it_frees_up(
    serve_site: Site,
) -> None:
    (serve_site.home / "config.toml").write_text(
        '[[harness.quotas]]\nname = "one-run-a-day"\nwindow = "24h"\nruns = 1\nper = "principal"\n', encoding="utf-8"
    )
    flag = serve_site.flag("quota")
    flag.touch()
    call = {"contract": "gated", "params": {"flag": str(flag)}}
    async with stdio_client_for(serve_site) as client:
        with anyio.fail_after(90):
            first = await client.call_tool("truss_run_contract", call)
            second = await client.call_tool("truss_run_contract", call)
    assert not first.is_error
    error = error_of(second)
    assert error["kind"] == "quota" and error["quota"] == "one-run-a-day" and error["dimension"] == "runs"
    assert isinstance(error["frees_at_ms"], int) and error["retryable"] is True
    assert "one-run-a-day" in text_of(second)


async def _approve(site: Site, session: str, call: str) -> None:
    command = [*truss_cmd(), "--home", str(site.home), "approve", session, call]
    done = await anyio.run_process(command, env=site.env, check=False)
    assert done.returncode == 0, done.stderr


def _waiting(state: TaskState) -> bool:
    return RUN_META in (state.meta or {})


async def _suspended_task(client: Client) -> tuple[str, str]:
    """Start the "asks" contract as a task and wait for its suspension: its task id and the waiting call."""
    with anyio.fail_after(60):
        handle = await start_task(client, {"contract": "asks"})
    state = await poll_until(client, handle.task_id, _waiting)
    return handle.task_id, (state.meta or {})[RUN_META]["waiting"][0]


async def test_a_suspended_task_resumes_once_the_operator_approves_and_completes_with_the_verdict(
    serve_site: Site,
) -> None:
    async with task_client(serve_site) as client:
        task_id, call = await _suspended_task(client)
        await _approve(serve_site, task_id, call)
        final = await poll_until(client, task_id, lambda s: s.status == "completed")
    assert final.result is not None and not final.result.get("isError"), final
    assert final.result["structuredContent"]["status"] == "pass"


async def test_a_task_approved_while_serve_mcp_was_down_resumes_when_polled_after_the_restart(
    serve_site: Site,
) -> None:
    async with task_client(serve_site) as client:
        task_id, call = await _suspended_task(client)
    await _approve(serve_site, task_id, call)
    async with task_client(serve_site) as client:
        final = await poll_until(client, task_id, lambda s: s.status == "completed")
    assert final.result is not None and not final.result.get("isError"), final
    assert final.result["structuredContent"]["status"] == "pass"


async def test_cancelling_a_task_serve_mcp_does_not_hold_leaves_its_waiting_run_waiting(serve_site: Site) -> None:
    async with task_client(serve_site) as client:
        with anyio.fail_after(60):
            handle = await start_task(client, {"contract": "asks"})
        state = await poll_until(client, handle.task_id, _waiting)
    await _approve(serve_site, handle.task_id, (state.meta or {})[RUN_META]["waiting"][0])
    # After a restart the task is only in the ledger: a cancel is acknowledged and starts nothing
    # (a poll or a repeated call resumes an approved run), so the one run slot stays free.
    flag = serve_site.flag("after-cancel")
    async with task_client(serve_site, "--max-concurrent-runs", "1") as client:
        with anyio.fail_after(60):
            await client.session.send_request(CancelTask(params=TaskIdParams(taskId=handle.task_id)), types.EmptyResult)
            other = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
        assert not (other.status_message or "").startswith("queued"), other
        flag.touch()
        await poll_until(client, other.task_id, lambda s: s.status == "completed")
        with anyio.fail_after(30):
            status = await client.call_tool("truss_contract_status", {"session": handle.task_id})
    assert not status.is_error and (status.structured_content or {})["status"] == "suspended", status


async def test_a_task_another_serve_mcp_drives_polls_as_working_and_completes_from_the_shared_ledger(
    serve_site: Site,
) -> None:
    flag = serve_site.flag("other-process")
    async with task_client(serve_site) as driver, task_client(serve_site) as other:
        with anyio.fail_after(60):
            handle = await start_task(driver, {"contract": "gated", "params": {"flag": str(flag)}})
            while True:  # until the driver has recorded the session's start
                status = structured(await driver.call_tool("truss_contract_status", {"session": handle.task_id}))
                if status["head"]:
                    break
                await anyio.sleep(0.05)
        state = await get(other, handle.task_id)
        assert state.status == "working" and "recorded as running" in (state.status_message or ""), state
        flag.touch()
        final = await poll_until(other, handle.task_id, lambda s: s.status == "completed")
    assert final.result is not None and final.result["structuredContent"]["status"] == "pass", final


async def test_tasks_nobody_polls_after_their_runs_finish_are_forgotten_past_the_finished_limit(
    serve_site: Site,
) -> None:
    # Regression: a task's state moved on from "running" only when tasks/get saw its run finished,
    # and only finished or cancelled tasks are ever forgotten, so a caller that started tasks and
    # never polled them grew the server's task table by one entry per run, without bound.
    flag = serve_site.flag("unpolled")
    flag.touch()
    kept = 2
    key = IdentityKey.load(serve_site.home / "identity.key")
    clock = SystemClock()
    store = open_store(serve_site.home / "ledger.db", key=key, clock=clock)
    backend = LedgerBackend(Runtime(store=store, key=key, clock=clock, home=serve_site.home, environ=serve_site.env))
    limits = ServeLimits(max_concurrent_runs=1, max_finished_kept=kept)
    config = ServeConfig(contracts_dir=serve_site.contracts, home=serve_site.home, backend=backend, clock=clock,
                         limits=limits)  # fmt: skip
    principal = Principal("acme", "alice")
    try:
        async with (
            serve_app(config, lambda ctx: principal) as app,
            Client(app.server, extensions=[Tasks()], cache=None) as client,
        ):
            started: list[str] = []
            with anyio.fail_after(120):
                for _ in range(kept + 3):
                    handle = await start_task(client, {"contract": "gated", "params": {"flag": str(flag)}})
                    started.append(handle.task_id)
                    while True:  # the ordinary status tool: it leaves the task's own state alone
                        status = await client.call_tool("truss_contract_status", {"session": handle.task_id})
                        if structured(status)["running"] is False:
                            break
                        await anyio.sleep(0.05)
                    await app.wait_idle()
            assert app.tasks_held <= kept
            # A forgotten task is still answered from the ledger.
            state = await get(client, started[0])
            assert state.status == "completed"
    finally:
        store.close()
