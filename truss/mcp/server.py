"""``truss serve-mcp``: other harnesses delegate contracts to Truss over MCP (DESIGN section 8).

The server advertises exactly four tools (``truss/mcp/_serve_tools.py``) on the SDK's low-level
``Server``, in both protocol eras, over stdio (``_serve_stdio.serve_stdio``) or Streamable HTTP
(``_serve_http.serve_http``). This module owns the app both transports run:

* **principals**: one per process on stdio, one per bearer token on HTTP (``TokenTable``); every
  session lookup is filtered by the caller's principal, and a session of another principal
  answers exactly like an unknown one;
* **runs as tasks of the server process**, not of the request: a run started by a request keeps
  going when its client disconnects or its request is cancelled, and is retrievable by handle;
* **bounds**: ``--max-concurrent-runs`` (beyond it an ``isError`` "busy" answer and nothing
  started), request size and nesting, answer size (a large export is referenced, not inlined).

It does not run contracts, read the ledger or build bundles itself: a ``ServeBackend`` does
(``truss/mcp/_serve_backend.py`` over the session, store and bundle modules), so the protocol
layer can be tested on its own. Failures of a run are tool results with ``isError``; only
protocol problems (unknown tool, malformed or oversized request) are JSON-RPC errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import anyio.abc
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError

from truss._clock import Clock
from truss._errors import InputError, NotFoundError, RuntimeFailure, TrussError
from truss._json import as_mapping
from truss.mcp._serve_core import Principal, ServeLimits, TokenTable, derive_session_id, json_depth, resolve_contract
from truss.mcp._serve_tasks import (
    MISSING_CLIENT_CAPABILITY,
    TASKS_EXTENSION,
    ServeTask,
    TaskIdParams,
    TaskUpdateParams,
    task_view,
    waiting_message,
    wants_task,
)
from truss.mcp._serve_tools import EXPORT, RUN, STATUS, TOOL_NAMES, VERDICT, parse_run, parse_session, tool_definitions

__all__ = [
    "ERROR_META",
    "Principal",
    "RunAnswer",
    "ServeApp",
    "ServeBackend",
    "ServeConfig",
    "ServeLimits",
    "SessionView",
    "TokenTable",
    "resolve_contract",
    "serve_app",
]

_log = logging.getLogger("truss.serve")

ERROR_META = "dev.truss/error"
"""The ``_meta`` key of an ``isError`` result holding the error's fields (kind, reason, retryable, ...)."""

# Statuses of a finished run that are failures of the delegated work (isError answers). "pass"
# is success, "running" and "suspended" are states a caller polls or waits on.
_ERROR_STATUSES = frozenset({"fail", "error", "interrupted", "diverged"})

ProgressSink = Callable[[Mapping[str, Any]], None]
Starter = Callable[[ProgressSink, anyio.Event], Awaitable["RunAnswer"]]
# A session a repeated session_id continues: it stopped to wait (approval, in doubt) or was interrupted.
# "running" is not among them: a run of another process on the same home may still own it.
_RESUMABLE = frozenset({"suspended", "interrupted"})
PrincipalOf = Callable[[ServerRequestContext[Any, Any]], "Principal | None"]


@dataclass(frozen=True)
class RunAnswer:
    """What ``truss_run_contract`` answers (and what a repeated ``session_id`` returns)."""

    session: str
    status: str
    verdict: Mapping[str, Any] | None = None
    head: str | None = None
    checkpoint: str | None = None
    reason: str | None = None
    waiting: tuple[str, ...] = ()  # call ids waiting for `truss approve` when suspended
    waiting_on: str | None = None  # what a suspended run waits for: approval, in_doubt, signal, task, interrupted

    def to_json(self) -> dict[str, Any]:
        finished = self.status not in ("running", "starting")
        return {
            "session": self.session,
            "status": self.status,
            "verdict": dict(self.verdict) if self.verdict is not None else None,
            "head": self.head,
            "checkpoint": self.checkpoint,
            "bundle_ref": {"tool": EXPORT, "arguments": {"session": self.session}} if finished else None,
            "reason": self.reason,
            "waiting": list(self.waiting),
            "waiting_on": self.waiting_on,
        }


@dataclass(frozen=True)
class SessionView:
    """What the store knows about a session, as much as serve-mcp needs to decide access."""

    session: str
    principal: Mapping[str, Any] | None
    status: str
    contract: str | None = None


class ServeBackend(Protocol):
    """Runs contracts and reads the ledger for the server. Sync methods are called from threads."""

    def load(self, path: Path, params: Mapping[str, Any], budget: Mapping[str, Any]) -> Any:
        """The effective contract at ``path`` with caller ``params`` checked and ``budget`` narrowed."""
        ...

    async def run(
        self,
        contract: Any,
        *,
        session_id: str,
        principal: Principal,
        on_progress: ProgressSink,
        stop: anyio.Event | None = None,
    ) -> RunAnswer:
        """Run ``contract`` as session ``session_id`` to its end (verdict, suspension or error).

        Setting ``stop`` asks the run to end early and record itself as interrupted.
        """
        ...

    async def resume(self, session_id: str, *, on_progress: ProgressSink, stop: anyio.Event | None = None) -> RunAnswer:
        """Continue a suspended or interrupted session from its record (still waiting: its answer)."""
        ...

    async def follow(self, session_id: str, *, stop: anyio.Event | None = None) -> RunAnswer:
        """Wait for a run another process (a replica on the same ledger) drives to stop running; its answer."""
        ...

    def lookup(self, session_id: str) -> SessionView | None: ...

    def answer(self, session_id: str) -> RunAnswer:
        """The run answer of a recorded session (status, verdict, head, checkpoint)."""
        ...

    def status(self, session_id: str) -> dict[str, Any]:
        """``counts``, ``budget_used``, ``head``, ``verification`` (and ``contract``) of a recorded session."""
        ...

    def envelope(self, session_id: str) -> Mapping[str, Any] | None: ...

    def export(self, session_id: str) -> bytes: ...


@dataclass(frozen=True)
class ServeConfig:
    contracts_dir: Path
    home: Path
    backend: ServeBackend
    clock: Clock
    limits: ServeLimits = field(default_factory=ServeLimits)
    # Retention (``truss.retention``): run in a worker thread at start and every ``sweep_every_s``.
    sweep: Callable[[], None] | None = None
    sweep_every_s: float = 86_400.0


@dataclass
class _Run:
    session: str
    principal: Principal
    contract: str | None
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: RunAnswer | None = None
    error: TrussError | None = None
    progress: dict[str, Any] = field(default_factory=dict[str, Any])
    events: int = 0
    sinks: list[ProgressSink] = field(default_factory=list[ProgressSink])
    counted: bool = True
    """Whether it holds a run slot: a run this process drives does; following another replica's does not."""

    def on_progress(self, event: Mapping[str, Any]) -> None:
        self.events += 1
        self.progress = {**event, "events": self.events}
        for sink in list(self.sinks):
            sink(self.progress)


def _internal(session: str, exc: BaseException) -> RuntimeFailure:
    return RuntimeFailure(
        f"session {session}: internal error ({type(exc).__name__}); the operator's log has the details",
        remedy="Report it to the operator; the ledger holds every committed step",
        session=session,
    )


def _first_truss_error(group: BaseExceptionGroup[Any]) -> TrussError | None:
    for exc in group.exceptions:
        if isinstance(exc, TrussError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_truss_error(cast("BaseExceptionGroup[Any]", exc))
            if found is not None:
                return found
    return None


class _Busy(RuntimeFailure):
    kind = "busy"


class ServeApp:
    """One serve-mcp server: the MCP ``Server``, its runs and their task group."""

    def __init__(self, config: ServeConfig, tg: anyio.abc.TaskGroup, principal_of: PrincipalOf) -> None:
        self.config = config
        self._tg = tg
        self._principal_of = principal_of
        self.stopping = anyio.Event()
        self._active = 0
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._tasks: OrderedDict[str, ServeTask] = OrderedDict()
        self._queued: OrderedDict[str, tuple[ServeTask, str | None, Starter]] = OrderedDict()
        self._tools = [types.Tool.model_validate(d) for d in tool_definitions()]
        self.server: Server[Any] = Server(
            "truss",
            version=_version(),
            title="Truss",
            instructions=(
                "Delegate a contract to Truss: call truss_run_contract with the name of one of the operator's "
                "contracts; the answer carries the signed verdict, the ledger head and the checkpoint. Use "
                "truss_contract_status, truss_ledger_verdict and truss_ledger_export with the session it returns."
            ),
            on_list_tools=self._list_tools,
        )
        # Registered as a plain handler: a task-augmented call answers a CreateTaskResult, which the
        # typed on_call_tool slot (CallToolResult | InputRequiredResult) cannot express.
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.server.middleware.append(self._bounds)
        # The 2026-07-28 Tasks extension (truss/mcp/_serve_tasks.py): advertised, and its two methods served.
        self.server.extensions[TASKS_EXTENSION] = {}
        self.server.add_request_handler("tasks/get", TaskIdParams, self._tasks_get)
        self.server.add_request_handler("tasks/cancel", TaskIdParams, self._tasks_cancel)
        self.server.add_request_handler("tasks/update", TaskUpdateParams, self._tasks_update)

    # -- state ------------------------------------------------------------------------------

    @property
    def active_runs(self) -> int:
        return self._active

    @property
    def tasks_held(self) -> int:
        """Tasks this process remembers (queued, running, and at most ``max_finished_kept`` finished)."""
        return len(self._tasks)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Ask every run in progress to stop (each records itself as interrupted), wait up to
        ``grace_s`` for them, then cancel what is left and leave ``serve_app``."""
        self.stopping.set()
        with anyio.move_on_after(grace_s):
            await self.wait_idle()
        self._tg.cancel_scope.cancel()

    async def wait_idle(self) -> None:
        """Return when no run is in progress (runs outlive their requests; the process waits for them)."""
        while True:
            pending = [run for run in self._runs.values() if not run.done.is_set()]
            if not pending:
                return
            await pending[0].done.wait()

    # -- protocol handlers ------------------------------------------------------------------

    async def _bounds(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        limit = self.config.limits.max_nesting_depth
        if ctx.params is not None and json_depth(ctx.params, limit) > limit:
            raise MCPError(code=types.INVALID_REQUEST, message=f"request nested deeper than {limit} levels")
        return await call_next(ctx)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools, next_cursor=None)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        if params.name not in TOOL_NAMES:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name[:128]}")
        principal = self._principal(ctx)
        arguments: Mapping[str, Any] = params.arguments or {}
        try:
            if params.name == RUN:
                return await self._run(ctx, principal, arguments)
            session = parse_session(arguments)
            if params.name == STATUS:
                return _ok(await self._status(principal, session))
            if params.name == VERDICT:
                return _ok(await self._verdict(principal, session))
            return _ok(await self._export(principal, session))
        except TrussError as exc:
            return _error(exc, self.config.contracts_dir)

    def _principal(self, ctx: ServerRequestContext[Any, Any]) -> Principal:
        principal = self._principal_of(ctx)
        if principal is None:
            # The HTTP edge answers 401 before a request gets here; this is the second lock.
            raise MCPError(code=types.INVALID_REQUEST, message="no principal for this request")
        return principal

    # -- truss_run_contract -----------------------------------------------------------------

    async def _run(
        self, ctx: ServerRequestContext[Any, Any], principal: Principal, arguments: Mapping[str, Any]
    ) -> types.CallToolResult | dict[str, Any]:
        request = parse_run(arguments)
        backend = self.config.backend
        as_task = wants_task(ctx.protocol_version, ctx.session.client_capabilities)

        wait = not request.run_async and not as_task
        if request.session_id is not None:
            for candidate in (request.session_id, derive_session_id(principal, request.session_id)):
                existing = await self._existing(ctx, principal, candidate, wait=wait)
                if existing is not None:
                    return self._task_for_existing(principal, candidate) if as_task else existing
            session_id = derive_session_id(principal, request.session_id)
        else:
            session_id = self.config.clock.new_id("s")

        path = resolve_contract(self.config.contracts_dir, request.contract)
        contract = await anyio.to_thread.run_sync(backend.load, path, request.params, request.budget)

        def start(sink: ProgressSink, stop: anyio.Event) -> Awaitable[RunAnswer]:
            return backend.run(contract, session_id=session_id, principal=principal, on_progress=sink, stop=stop)

        if as_task:
            return self._start_task(principal, session_id, request.contract, start)
        return await self._start(ctx, principal, session_id, request.contract, start, wait=wait)

    async def _start(
        self,
        ctx: ServerRequestContext[Any, Any],
        principal: Principal,
        session_id: str,
        contract: str | None,
        start: Starter,
        *,
        wait: bool,
        counted: bool = True,
    ) -> types.CallToolResult:
        # From here to the start of the task nothing awaits, so two requests with one key can never
        # both start a run, and the count of active runs can never pass the limit.
        run = self._runs.get(session_id)
        if run is not None and not run.done.is_set():
            return await self._wait(ctx, run) if wait else await self._answer_for(run)
        run = self._launch(principal, session_id, contract, start, counted=counted)
        if not wait:
            return _ok(RunAnswer(session=session_id, status="running").to_json())
        return await self._wait(ctx, run)

    def _launch(
        self, principal: Principal, session_id: str, contract: str | None, start: Starter, *, counted: bool = True
    ) -> _Run:
        """Start a run as a task of the server process now, or raise ``_Busy`` (nothing awaits here).

        ``counted`` False: it follows a run another replica drives, and takes no run slot."""
        if self.stopping.is_set():
            raise _Busy("the server is stopping; nothing was started", remedy="Retry later", retryable=True)
        limit = self.config.limits.max_concurrent_runs
        if counted and self._active >= limit:
            raise _Busy(
                f"busy: {self._active} runs in progress (the limit is {limit}); nothing was started",
                remedy="Retry later",
                retryable=True,
                limit="max_concurrent_runs",
            )
        run = _Run(session=session_id, principal=principal, contract=contract, counted=counted)
        self._runs.pop(session_id, None)  # a finished run being resumed: the new task replaces it
        self._runs[session_id] = run
        if counted:
            self._active += 1
        self._tg.start_soon(self._drive, run, start)
        return run

    async def _existing(
        self, ctx: ServerRequestContext[Any, Any], principal: Principal, session_id: str, *, wait: bool
    ) -> types.CallToolResult | None:
        """The answer for a session this principal already has (waiting for it when ``wait``), else None."""
        run = self._runs.get(session_id)
        if run is not None:
            if run.principal != principal:
                return None
            if not run.done.is_set():
                return await self._wait(ctx, run) if wait else await self._answer_for(run)
        # A finished run is answered from the store, which may have moved on (an approval given).
        view = await anyio.to_thread.run_sync(self.config.backend.lookup, session_id)
        if view is None and run is not None:
            return await self._answer_for(run)  # failed before its session was recorded
        if view is None or not principal.owns(view.principal):
            return None
        if view.status in _RESUMABLE:
            backend = self.config.backend

            def resume(sink: ProgressSink, stop: anyio.Event) -> Awaitable[RunAnswer]:
                return backend.resume(session_id, on_progress=sink, stop=stop)

            return await self._start(ctx, principal, session_id, view.contract, resume, wait=wait)
        if view.status == "running" and wait and run is None:
            # Another replica on the same ledger drives it: wait for its end as for a run of ours, but
            # in no run slot. The limit bounds the runs this process drives; following one only reads
            # the ledger, one follower per session, and the replicas driving them bound how many.
            backend = self.config.backend

            def follow(sink: ProgressSink, stop: anyio.Event) -> Awaitable[RunAnswer]:
                return backend.follow(session_id, stop=stop)

            return await self._start(ctx, principal, session_id, view.contract, follow, wait=wait, counted=False)
        answer = await anyio.to_thread.run_sync(self.config.backend.answer, session_id)
        return _answer_result(answer)

    async def _answer_for(self, run: _Run) -> types.CallToolResult:
        if not run.done.is_set():
            return _ok(RunAnswer(session=run.session, status="running").to_json())
        if run.error is not None:
            return _error(run.error, self.config.contracts_dir, session=run.session)
        assert run.answer is not None
        return _answer_result(run.answer)

    async def _wait(self, ctx: ServerRequestContext[Any, Any], run: _Run) -> types.CallToolResult:
        meta: Mapping[str, Any] = ctx.meta or {}
        wants_progress = meta.get("progressToken", meta.get("progress_token")) is not None
        if not wants_progress:
            await run.done.wait()
            return await self._answer_for(run)
        send, receive = anyio.create_memory_object_stream[Mapping[str, Any]](64)

        def sink(event: Mapping[str, Any]) -> None:
            # Progress is advisory: a slow client loses some, never the run.
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.send_nowait(event)

        async def forward() -> None:
            async with receive:
                async for event in receive:
                    try:
                        await ctx.session.report_progress(float(event.get("events", 0)), None, _progress_text(event))
                    except Exception:  # the client went away; the run goes on
                        _log.debug("progress notification failed", exc_info=True)
                        return

        run.sinks.append(sink)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(forward)
                await run.done.wait()
                send.close()
        finally:
            run.sinks.remove(sink)
            send.close()
        return await self._answer_for(run)

    async def _drive(self, run: _Run, start: Starter) -> None:
        try:
            run.answer = await start(run.on_progress, self.stopping)
        except TrussError as exc:
            run.error = exc
        except ExceptionGroup as group:  # a task group inside the run; its Truss error says what went wrong
            found = _first_truss_error(group)
            if found is None:
                _log.error("run %s failed", run.session, exc_info=group)
                found = _internal(run.session, group)
            run.error = found
        except anyio.get_cancelled_exc_class():
            run.error = RuntimeFailure(
                f"session {run.session}: the run was interrupted because the server is stopping",
                remedy="Ask the operator to resume it",
                session=run.session,
            )
            raise
        except Exception as exc:  # a bug must not take the server (and other runs) down
            _log.exception("run %s failed", run.session)
            run.error = _internal(run.session, exc)
        finally:
            if run.counted:
                self._active -= 1
            run.done.set()
            task = self._tasks.get(run.session)
            if task is not None:
                task.updated_ms = self.config.clock.now_ms()
                # Finished now, not when tasks/get first sees it: a task nobody polls must still be
                # forgettable, or the table grows by one per run (tasks/get answers it from the ledger).
                if task.state == "running":
                    task.state = "finished"
                self._forget_old_tasks()
            self._forget_old()
            self._dispatch()

    def _forget_old(self) -> None:
        finished = [sid for sid, run in self._runs.items() if run.done.is_set()]
        for sid in finished[: max(0, len(finished) - self.config.limits.max_finished_kept)]:
            del self._runs[sid]

    # -- native MCP Tasks (truss/mcp/_serve_tasks.py) ----------------------------------------

    def _start_task(
        self, principal: Principal, session_id: str, contract: str | None, start: Starter
    ) -> dict[str, Any]:
        """Register the run as a task and start it (or queue it for a free slot); answer its seed at once."""
        now = self.config.clock.now_ms()
        existing = self._tasks.get(session_id)
        if existing is not None and existing.principal == principal and existing.state in ("queued", "running"):
            return self._seed(existing)
        if self.stopping.is_set():
            raise _Busy("the server is stopping; nothing was started", remedy="Retry later", retryable=True)
        limit = self.config.limits.max_concurrent_runs
        if self._active >= limit and len(self._queued) >= limit:
            raise _Busy(
                f"busy: {self._active} runs in progress and {len(self._queued)} tasks queued (the limit is {limit} "
                "of each); nothing was started",
                remedy="Retry later",
                retryable=True,
                limit="max_concurrent_runs",
            )
        task = ServeTask(session_id, principal, created_ms=now, updated_ms=now)
        self._tasks[session_id] = task
        self._tasks.move_to_end(session_id)
        self._queued[session_id] = (task, contract, start)
        self._dispatch()
        self._forget_old_tasks()
        return self._seed(task)

    def _task_for_existing(self, principal: Principal, session_id: str) -> dict[str, Any]:
        """A repeated session id in task mode: the task of that session (resumed when it could be)."""
        now = self.config.clock.now_ms()
        task = self._tasks.get(session_id)
        if task is None or task.principal != principal:
            task = ServeTask(session_id, principal, created_ms=now, updated_ms=now, state="finished")
            self._tasks[session_id] = task
            self._forget_old_tasks()
        run = self._runs.get(session_id)
        if run is not None and not run.done.is_set():
            task.state = "running"
        return self._seed(task)

    def _dispatch(self) -> None:
        """Start queued tasks, oldest first, while run slots are free."""
        limit = self.config.limits.max_concurrent_runs
        while self._queued and self._active < limit and not self.stopping.is_set():
            session_id, (task, contract, start) = next(iter(self._queued.items()))
            del self._queued[session_id]
            task.state = "running"
            task.updated_ms = self.config.clock.now_ms()
            self._launch(task.principal, session_id, contract, start)

    def _forget_old_tasks(self) -> None:
        done = [t for t, task in self._tasks.items() if task.state in ("finished", "cancelled")]
        for task_id in done[: max(0, len(done) - self.config.limits.max_finished_kept)]:
            del self._tasks[task_id]

    def _seed(self, task: ServeTask) -> dict[str, Any]:
        # A CreateTaskResult rides the tools/call answer as a claimed shape (resultType "task"); the
        # SDK's runner passes a modern-era extension resultType through unsieved.
        message = self._queued_message() if task.state == "queued" else "the run is starting"
        view = task_view(task.task_id, status="working", created_ms=task.created_ms, updated_ms=task.updated_ms,
                         message=message)  # fmt: skip
        return {"resultType": "task", **view}

    def _queued_message(self) -> str:
        return (
            f"queued: {self._active} runs in progress (the limit is {self.config.limits.max_concurrent_runs}); "
            "the run starts when one ends, and tasks/cancel stops it before it starts"
        )

    def _task_caller(self, ctx: ServerRequestContext[Any, Any]) -> Principal:
        # The extension's methods are for callers that declare it on the request (SEP-2663, SEP-2575).
        if not wants_task(ctx.protocol_version, ctx.session.client_capabilities):
            raise MCPError(
                code=MISSING_CLIENT_CAPABILITY,
                message="Missing required client capability",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        return self._principal(ctx)

    async def _tasks_get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        principal = self._task_caller(ctx)
        task = self._owned_task(principal, params.task_id)
        if task is None:
            return await self._stored_task(principal, params.task_id)
        base: dict[str, Any] = {"created_ms": task.created_ms, "updated_ms": task.updated_ms}
        if task.state == "queued":
            return task_view(task.task_id, status="working", message=self._queued_message(), **base)
        if task.state == "cancelled":
            return task_view(task.task_id, status="cancelled", message="cancelled before the run started; "
                             "nothing was run or recorded", **base)  # fmt: skip
        run = self._runs.get(task.task_id)
        if run is None:
            return await self._stored_task(principal, params.task_id, task)
        if not run.done.is_set():
            note = _progress_text(run.progress) if run.progress else "running"
            if task.cancel_asked:
                note = "cancellation was asked after the run started: it runs to its verdict; " + note
            return task_view(task.task_id, status="working", message=note, **base)
        task.state = "finished"
        if run.error is not None:
            result = _error(run.error, self.config.contracts_dir, session=run.session)
            return task_view(task.task_id, status="completed", message=f"refused or failed: {run.error.kind}",
                             result=_wire(result), **base)  # fmt: skip
        assert run.answer is not None
        return await self._answered_task(principal, task, run.answer, base, seen=run.answer.head)

    async def _answered_task(
        self,
        principal: Principal,
        task: ServeTask,
        answer: RunAnswer,
        base: dict[str, Any],
        *,
        seen: str | None,
        fresh: SessionView | None = None,
    ) -> dict[str, Any]:
        """``seen``: the session head this process saw when the run suspended (None: it never saw it);
        ``fresh``: the session as just read, when ``answer`` was read with it (not read again)."""
        data = answer.to_json()
        if answer.status in _RESUMABLE:
            await self._resume_if_moved(principal, task, seen, (fresh, answer.head) if fresh is not None else None)
            run = self._runs.get(task.task_id)
            if run is not None and not run.done.is_set():
                return task_view(task.task_id, status="working", message="resumed: running", **base)
            return task_view(task.task_id, status="working", message=waiting_message(answer.session, data),
                             run=data, **base)  # fmt: skip
        note = f"session {answer.session}: {answer.status}"
        if task.cancel_asked:
            note += " (cancellation was asked after the run started; this is how it ended)"
        return task_view(task.task_id, status="completed", message=note, result=_wire(_answer_result(answer)), **base)

    async def _resume_if_moved(
        self, principal: Principal, task: ServeTask, seen: str | None, current: tuple[SessionView, str | None] | None
    ) -> None:
        """Resume a waiting session once something was recorded after its suspension (an approval,
        a resolution, a signal): the task follows the ledger, as a repeated call would. A suspension
        this process did not see (``seen`` None: it was restarted, or forgot the run) is resumed once
        per head, since what was recorded while it was down cannot be told apart; a resume that
        still waits answers as before. ``current``: the session and its head, when the caller just read them."""
        view = current[0] if current else await anyio.to_thread.run_sync(self.config.backend.lookup, task.task_id)
        if view is None or not principal.owns(view.principal) or view.status not in _RESUMABLE:
            return
        if seen is None and view.status != "suspended":
            return  # interrupted: resumed by the caller's repeated truss_run_contract, as its message says
        head = (
            current[1]
            if current
            else await anyio.to_thread.run_sync(lambda: self.config.backend.answer(task.task_id).head)
        )
        if head in (seen, task.resume_tried):
            return
        task.resume_tried = head
        backend = self.config.backend
        session_id = task.task_id

        def resume(sink: ProgressSink, stop: anyio.Event) -> Awaitable[RunAnswer]:
            return backend.resume(session_id, on_progress=sink, stop=stop)

        with contextlib.suppress(_Busy):  # no slot now: the next poll tries again
            self._launch(principal, session_id, view.contract, resume)
            task.updated_ms = self.config.clock.now_ms()

    async def _stored_task(self, principal: Principal, task_id: str, task: ServeTask | None = None) -> dict[str, Any]:
        """A task this process does not hold (a restart, or forgotten): answered from the ledger."""
        view = await self._stored_session(principal, task_id)
        now = self.config.clock.now_ms()
        task = task or ServeTask(task_id, principal, created_ms=now, updated_ms=now, state="finished")
        if self._tasks.setdefault(task_id, task) is task:
            self._forget_old_tasks()
        base: dict[str, Any] = {"created_ms": task.created_ms, "updated_ms": task.updated_ms}
        if view.status == "running":
            return task_view(task_id, status="working", message="running (recorded as running; its owner is "
                             "another process or it stopped without recording it)", **base)  # fmt: skip
        # Read only for a run that no longer runs: a poll of one another replica drives reads its row alone.
        answer = await anyio.to_thread.run_sync(self.config.backend.answer, task_id)
        return await self._answered_task(principal, task, answer, base, seen=None, fresh=view)

    async def _stored_session(self, principal: Principal, task_id: str) -> SessionView:
        """The caller's session behind a task this process does not hold; an unknown task (a JSON-RPC
        invalid-params error) when there is none, or it is another principal's."""
        try:
            return await self._owned(principal, task_id)
        except NotFoundError:
            raise MCPError(code=types.INVALID_PARAMS, message="unknown task") from None

    def _owned_task(self, principal: Principal, task_id: str) -> ServeTask | None:
        task = self._tasks.get(task_id)
        return task if task is not None and task.principal == principal else None

    async def _tasks_update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> dict[str, Any]:
        """A run's task never asks the caller for input (what it waits on comes from the operator), so
        every response is for a key that is not outstanding: ignored, as the extension says; acknowledged."""
        principal = self._task_caller(ctx)
        if self._owned_task(principal, params.task_id) is None:
            await self._stored_session(principal, params.task_id)  # an unknown task is an error
        return {}

    async def _tasks_cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        principal = self._task_caller(ctx)
        task = self._owned_task(principal, params.task_id)
        if task is None:
            # An unknown task is an error; a stored one is acknowledged, and nothing is read or
            # started for it (its status, and a resume once approved, are for tasks/get).
            await self._stored_session(principal, params.task_id)
            return {}
        task.updated_ms = self.config.clock.now_ms()
        if task.state == "queued":
            self._queued.pop(task.task_id, None)
            task.state = "cancelled"
        elif task.state == "running":
            task.cancel_asked = True  # cooperative, as the extension allows: a started run reaches its verdict
        return {}

    # -- the read tools ---------------------------------------------------------------------

    async def _owned(self, principal: Principal, session_id: str) -> SessionView:
        view = await anyio.to_thread.run_sync(self.config.backend.lookup, session_id)
        if view is None or not principal.owns(view.principal):
            raise _not_found(session_id)
        return view

    async def _status(self, principal: Principal, session_id: str) -> dict[str, Any]:
        run = self._runs.get(session_id)
        if run is not None and run.principal == principal and not run.done.is_set():
            view = await anyio.to_thread.run_sync(self.config.backend.lookup, session_id)
            base: dict[str, Any] = {"counts": {}, "budget_used": {}, "head": None, "verification": None}
            if view is not None:
                base = await anyio.to_thread.run_sync(self.config.backend.status, session_id)
            return {
                "session": session_id,
                "status": "running",
                "running": True,
                "contract": run.contract,
                "progress": dict(run.progress) or None,
                **{k: v for k, v in base.items() if k not in ("session", "status", "running", "progress")},
            }
        if run is not None and run.principal == principal and run.error is not None:
            view = await anyio.to_thread.run_sync(self.config.backend.lookup, session_id)
            if view is None:
                raise run.error
        view = await self._owned(principal, session_id)
        status = await anyio.to_thread.run_sync(self.config.backend.status, session_id)
        return {
            "session": session_id,
            "status": view.status,
            "running": False,
            "contract": view.contract,
            "progress": None,
            **{k: v for k, v in status.items() if k not in ("session", "status", "running", "progress")},
        }

    async def _verdict(self, principal: Principal, session_id: str) -> dict[str, Any]:
        view = await self._owned(principal, session_id)
        envelope = await anyio.to_thread.run_sync(self.config.backend.envelope, session_id)
        if envelope is None:
            raise NotFoundError(
                f"session {session_id} has no verdict yet (status {view.status})",
                remedy="Wait for the run to finish (truss_contract_status), then ask again",
                what="verdict",
                name=session_id,
            )
        return {"session": session_id, "status": view.status, "envelope": dict(envelope)}

    async def _export(self, principal: Principal, session_id: str) -> dict[str, Any]:
        await self._owned(principal, session_id)
        if session_id in self._runs and not self._runs[session_id].done.is_set():
            raise InputError(
                f"session {session_id} is still running",
                remedy="Export it when truss_contract_status reports it finished",
                what="session",
                reason="running",
            )
        data = await anyio.to_thread.run_sync(self.config.backend.export, session_id)
        return await anyio.to_thread.run_sync(self._bundle_answer, session_id, data)

    def _bundle_answer(self, session_id: str, data: bytes) -> dict[str, Any]:
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        answer: dict[str, Any] = {"session": session_id, "bytes": len(data), "sha256": f"sha256:{digest}"}
        if len(data) <= self.config.limits.max_answer_bytes:
            try:
                bundle = json.loads(data)
            except ValueError:
                bundle = None
            if isinstance(bundle, dict):
                return {**answer, "inline": True, "bundle": bundle, "path": None}
        exports = self.config.home / "exports"
        exports.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = exports / f"{session_id}-{digest[:12]}.bundle.json"
        if not path.exists():
            # Written beside and renamed, so a reader never sees half a bundle.
            partial = path.with_suffix(".partial")
            partial.write_bytes(data)
            partial.chmod(0o600)
            partial.replace(path)
        return {**answer, "inline": False, "bundle": None, "path": str(path)}


def _not_found(session_id: str) -> NotFoundError:
    return NotFoundError(
        f"no session {session_id!r}",
        remedy="Use a session id that truss_run_contract returned to you",
        what="session",
        name=session_id,
    )


def _progress_text(event: Mapping[str, Any]) -> str:
    """One line like the CLI's: what happened, to which tool, how long, and the budget left."""
    parts = [str(event.get(k)) for k in ("kind", "tool", "outcome", "detail") if event.get(k) not in (None, "")]
    duration = event.get("duration_ms")
    if isinstance(duration, int | float):
        parts.append(f"{duration:.0f}ms")
    left = as_mapping(event.get("budget_left"))
    if left is not None:
        parts.append("left: " + ", ".join(f"{k}={v}" for k, v in left.items()))
    return " ".join(parts)[:300]


def _ok(data: Mapping[str, Any], *, is_error: bool = False, text: str | None = None) -> types.CallToolResult:
    body = json.dumps(data, ensure_ascii=False, sort_keys=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text if text is not None else body)],
        structured_content=dict(data),
        is_error=is_error,
    )


def _answer_result(answer: RunAnswer) -> types.CallToolResult:
    data = answer.to_json()
    summary = f"session {answer.session}: {answer.status}"
    if answer.reason:
        summary += f" ({answer.reason})"
    if answer.head:
        summary += f"; head {answer.head}"
    if answer.checkpoint:
        summary += "; checkpoint signed"
    return _ok(data, is_error=answer.status in _ERROR_STATUSES, text=summary + "\n" + json.dumps(data))


def _error(exc: TrussError, contracts_dir: Path, **extra: Any) -> types.CallToolResult:
    # Operator paths are none of the caller's business; the contract name is enough to act on.
    root = str(contracts_dir.resolve())
    text = exc.diagnostics().replace(root + "/", "").replace(root, "<contracts>")
    data = {k: v for k, v in exc.to_json().items() if k not in ("file",)}
    data["message"] = str(data.get("message", "")).replace(root + "/", "").replace(root, "<contracts>")
    data.update(extra)
    # No structuredContent: clients validate it against the tool's outputSchema even on errors
    # (the TypeScript SDK does), so the machine-readable error rides in the result's _meta.
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=True,
        _meta={ERROR_META: data},
    )


def _wire(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def _version() -> str:
    from truss import __version__

    return __version__


@asynccontextmanager
async def serve_app(config: ServeConfig, principal_of: PrincipalOf) -> AsyncGenerator[ServeApp]:
    """A ``ServeApp`` whose runs live in a task group of this context (the server process).

    On exit the context waits for runs still in progress (each bounded by its contract's
    deadline) unless it is cancelled, in which case the runs are interrupted.
    """
    async with anyio.create_task_group() as tg:
        app = ServeApp(config, tg, principal_of)
        housekeeping = anyio.CancelScope()  # entered by the sweeper's task, cancelled when serving ends
        if config.sweep is not None:
            tg.start_soon(_sweep_daily, config.sweep, config.sweep_every_s, housekeeping)
        yield app
        await app.wait_idle()
        housekeeping.cancel()


async def _sweep_daily(sweep: Callable[[], None], every_s: float, scope: anyio.CancelScope) -> None:
    """Retention at start and then every ``every_s``; a failed sweep is logged, never fatal."""
    with scope:
        while True:
            try:
                await anyio.to_thread.run_sync(sweep)
            except Exception:  # retention must never take the server (or its runs) down
                _log.warning("retention sweep failed", exc_info=True)
            await anyio.sleep(every_s)


def say(text: str) -> None:
    """One line on the operator's stderr (never stdout: on stdio that is the protocol channel)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
