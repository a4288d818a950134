"""What a provider adds to one model turn: build the wire body, POST it, check and map the answer.

Against a loopback HTTP server (127.0.0.1, a thread) that answers every POST with the same recorded
Messages / Chat Completions answer (three tool calls), compare per turn, interleaved, same run:

- baseline: a raw ``httpx2.AsyncClient`` POST of the same body, reading and ``json.loads``-ing the
  answer (what any client must do at the least);
- ``AnthropicProvider.next_turn`` and ``OpenAIProvider.next_turn`` on a 20-message conversation.

Prints medians and the ratio provider / baseline. ``--turns N`` (default 300) per variant.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2

from truss.providers import AnthropicProvider, OpenAIProvider, ToolSpec, TurnRequest
from truss.providers.anthropic import to_wire as anthropic_wire
from truss.providers.openai import to_wire as openai_wire
from truss.testing import ManualClock

WIRE = Path(__file__).resolve().parent.parent / "tests" / "providers" / "wire"


def serve(answer: bytes) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # One write per answer and no Nagle: otherwise delayed ACKs (40 ms) swamp what is measured.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(answer)}\r\n\r\n"
            self.wfile.write(head.encode() + answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    host, port = httpd.server_address[:2]
    return httpd, f"http://{host!s}:{port}"


def conversation() -> TurnRequest:
    tools = [ToolSpec(f"mcp__s__tool_{i}", "A tool " * 10, {"type": "object", "properties": {}}) for i in range(8)]
    messages: list[dict[str, Any]] = [{"role": "user", "text": "Do the task. " * 20}]
    for turn in range(6):
        calls = [{"id": f"c{turn}.{i}", "name": "mcp__s__tool_1", "arguments": {"k": "v" * 40}} for i in range(2)]
        messages.append({"role": "assistant", "text": "Working on it.", "tool_calls": calls})
        for call in calls:
            messages.append(
                {"role": "tool", "call_id": call["id"], "name": call["name"], "is_error": False, "text": "r" * 400}
            )
    return TurnRequest("You are careful.", messages, tools, 7)


async def measure(turns: int) -> dict[str, float]:
    request = conversation()
    results: dict[str, list[float]] = {}
    for kind in ("anthropic", "openai"):
        name = "three_tool_uses.json" if kind == "anthropic" else "three_tool_calls.json"
        answer = (WIRE / kind / name).read_bytes()
        httpd, url = serve(answer)
        try:
            if kind == "anthropic":
                provider: Any = AnthropicProvider(model="m", api_key="k", base_url=url, clock=ManualClock())
                body = anthropic_wire(request, model="m", max_output_tokens=1024)
                path = url + "/v1/messages"
            else:
                provider = OpenAIProvider(model="m", api_key="k", base_url=url, clock=ManualClock())
                body = openai_wire(request, model="m", max_output_tokens=1024, limit_field="max_tokens")
                path = url + "/chat/completions"
            payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
            headers = {"content-type": "application/json", "accept": "application/json"}
            async with httpx2.AsyncClient() as raw:
                base: list[float] = []
                mine: list[float] = []
                for _ in range(20):  # warm both connection pools
                    await provider.next_turn(request)
                    json.loads((await raw.post(path, content=payload, headers=headers)).content)
                for _ in range(turns):
                    t0 = time.perf_counter()
                    json.loads((await raw.post(path, content=payload, headers=headers)).content)
                    t1 = time.perf_counter()
                    await provider.next_turn(request)
                    t2 = time.perf_counter()
                    base.append(t1 - t0)
                    mine.append(t2 - t1)
            await provider.aclose()
        finally:
            httpd.shutdown()
            httpd.server_close()
        results[f"{kind}_baseline"] = base
        results[kind] = mine
    return {k: statistics.median(v) for k, v in results.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    medians = anyio.run(measure, args.turns)
    for kind in ("anthropic", "openai"):
        base, mine = medians[f"{kind}_baseline"], medians[kind]
        print(f"{kind:9}  provider {mine * 1e6:8.0f} µs   raw POST {base * 1e6:8.0f} µs   ratio {mine / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
