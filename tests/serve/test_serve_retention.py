"""serve-mcp sweeps retention at its start ([harness] keep), leaving unfinished sessions alone."""

from __future__ import annotations

import anyio

from tests.retention.test_sweep import payload_count, record_sessions
from tests.serve.conftest import Site, stdio_client_for


def test_serve_mcp_erases_old_payloads_at_start_and_keeps_an_in_doubt_session(serve_site: Site) -> None:
    recorded = record_sessions(serve_site.home)
    doubt_before = payload_count(serve_site.home, recorded["doubt"])
    assert payload_count(serve_site.home, recorded["ended"]) > 0
    (serve_site.home / "config.toml").write_text('[harness]\nkeep = "30d"\n', encoding="utf-8")

    async def serve_once() -> None:
        async with stdio_client_for(serve_site) as client:
            with anyio.fail_after(60):
                await client.list_tools()
                while True:  # the sweep runs in a worker thread once the server has started
                    if payload_count(serve_site.home, recorded["ended"]) == 0:
                        break
                    await anyio.sleep(0.05)

    anyio.run(serve_once)
    assert payload_count(serve_site.home, recorded["doubt"]) == doubt_before
