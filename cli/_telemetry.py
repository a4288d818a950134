"""Live telemetry for the commands that run contracts (``run``, ``resume``, ``serve-mcp``).

``open_telemetry`` reads the operator's ``[telemetry]`` (``HOME/config.toml``) and the ``OTEL_*``
variables before anything runs, so a bad setting, or telemetry configured without the ``otel``
extra, is an error at start (exit 2) and never a half-started run. It returns None when telemetry
is off. ``close_telemetry`` sends what is queued (bounded by the settings' ``shutdown_timeout``) and
says on stderr what was not delivered; it never changes the command's exit code. Nothing here
imports ``opentelemetry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from truss_cli._ctx import Ctx

if TYPE_CHECKING:
    from truss.contract import Contract
    from truss.telemetry import ExportStats, Telemetry

__all__ = ["close_telemetry", "open_telemetry", "secrets_of"]


def open_telemetry(ctx: Ctx, environ: Mapping[str, str], store: Any) -> Telemetry | None:
    """The process's span exporter, or None when telemetry is off (docs/telemetry.md)."""
    from truss.contract import load_telemetry_config
    from truss.telemetry import Telemetry, resolve_settings

    settings = resolve_settings(load_telemetry_config(ctx.home), environ)
    if settings is None:
        return None
    from truss._clock import SystemClock

    # The exporter's retry and batch timers measure real time even when a test injects a clock.
    telemetry = Telemetry(settings, origin=str(store.origin), clock=SystemClock(), store=store)
    if ctx.verbose:
        ctx.progress(f"truss: telemetry: spans go as {settings.describe()}")
    return telemetry


def secrets_of(contract: Contract, environ: Mapping[str, str]) -> list[str]:
    """The values of a contract's ``secret_env`` and secret headers, for the exporter to scrub."""
    names: list[str] = []
    for server in contract.mcp.servers:
        names += list(server.secret_env)
        names += [h.secret_env for h in server.headers.values() if not isinstance(h, str)]
    return [environ[n] for n in names if environ.get(n)]


def close_telemetry(ctx: Ctx, telemetry: Telemetry | None) -> ExportStats | None:
    """Flush and stop ``telemetry``; report on stderr what was lost (always with ``-v``)."""
    if telemetry is None:
        return None
    try:
        stats = telemetry.close()
    except KeyboardInterrupt:  # a second Ctrl-C while spans are flushed: stop waiting for them
        stats = telemetry.close(0)
    where = telemetry.settings.describe()
    if stats.lost:
        parts = [f"{n} {word}" for n, word in (
            (stats.dropped, "dropped (the queue was full)"),
            (stats.failed, f"failed ({stats.last_error})"),
            (stats.rejected, "rejected by the collector"),
            (stats.unsent, "still queued when Truss stopped waiting"),
        ) if n]  # fmt: skip
        ctx.progress(
            f"truss: telemetry: {stats.lost} of {stats.offered} span(s) were not delivered ({', '.join(parts)}); "
            f"spans go as {where}. The run and its ledger are not affected."
        )
    elif ctx.verbose:
        ctx.progress(f"truss: telemetry: {stats.exported} span(s) delivered as {where}")
    return stats
