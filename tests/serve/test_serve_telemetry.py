"""serve-mcp with telemetry on: a delegated run's spans reach a real OTLP/HTTP receiver while serving."""

from __future__ import annotations

import anyio
import pytest

from tests.serve.conftest import Site, stdio_client_for, structured
from tests.telemetry.conftest import require_otel_extra

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_a_delegated_run_sends_its_spans_while_serve_mcp_keeps_serving(serve_site: Site) -> None:
    require_otel_extra()
    from tests.telemetry.receiver import receiver

    with receiver() as otlp:
        (serve_site.home / "config.toml").write_text(
            f'[telemetry]\notlp_endpoint = "{otlp.endpoint}"\nschedule_delay = "50ms"\n', encoding="utf-8"
        )
        with anyio.fail_after(120):
            async with stdio_client_for(serve_site) as client:
                answer = structured(await client.call_tool("truss_run_contract", {"contract": "hello"}))
                assert answer["status"] == "pass"
                # Delivered by the exporter's schedule while the server still runs, not only at its exit.
                spans = await anyio.to_thread.run_sync(lambda: otlp.wait_for(1 + 3 + 2, 60))
    session = answer["session"]
    mine = [s for s in spans if s["attributes"].get("truss.session.id") == session]
    names = sorted(s["name"] for s in mine)
    assert names == ["chat", "chat", "chat", "execute_tool convert_time", "execute_tool get_current_time",
                     "invoke_agent hello"]  # fmt: skip
    [agent] = [s for s in mine if s["parent_span_id"] is None]
    assert agent["attributes"]["gen_ai.conversation.id"] == session
    assert {s["attributes"].get("truss.server.name") for s in mine if s["name"].startswith("execute_tool")} == {"time"}
