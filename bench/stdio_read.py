"""Reading one long line from a stdio server: the SDK's reader vs Truss's bounded reader.

1. the readers alone, in this process: one line of N MB of JSON (a tools/call answer holding one
   text) fed in 64 KiB chunks, as a pipe delivers them, to (a) the SDK's algorithm (append the
   chunk to the line so far and split again: ``mcp.client.stdio``'s ``stdout_reader``) and (b)
   ``truss.mcp._wire.LineReader`` with a bound above the line (so it reads and parses the whole
   message, the fair comparison) and (c) with the default bound of 1 MiB + 64 KiB (so it refuses
   the message as it passes the bound and drops the rest as it arrives). Medians of ``--runs``;
   the ratio of (a) to (b) and (c), and the most bytes (c) ever held;
2. end to end: ``truss.mcp.client.connect`` calling a stdio server that answers with a 50 MB line,
   with the default ``max_result_bytes``: how long until the call comes back ``result_too_large``
   (before the bounded reader, the SDK read it for minutes and the call ended as a timeout).

Usage: ``python bench/stdio_read.py [--sizes 5,10,20] [--runs 3]``. No peers needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp import types  # noqa: E402
from mcp.shared.message import SessionMessage  # noqa: E402

from truss._clock import SystemClock  # noqa: E402
from truss.contract import Contract  # noqa: E402
from truss.mcp._wire import ENVELOPE_BYTES, LineReader, Wire  # noqa: E402
from truss.mcp.client import connect  # noqa: E402

CHUNK = 65_536
ANSWERS = REPO / "tests" / "security" / "servers" / "answers.py"


def _line(megabytes: int) -> bytes:
    text = "x" * (megabytes * 1_000_000)
    result = {"content": [{"type": "text", "text": text}], "isError": False}
    return json.dumps({"jsonrpc": "2.0", "id": 7, "result": result}).encode() + b"\n"


def _sdk_reader(data: bytes) -> int:
    """The SDK's stdout_reader loop, minus the pipe: append, split, parse each whole line."""
    buffer = ""
    parsed = 0
    for start in range(0, len(data), CHUNK):
        lines = (buffer + data[start : start + CHUNK].decode()).split("\n")
        buffer = lines.pop()
        for line in lines:
            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            parsed += 1
    return parsed


def _truss_reader(data: bytes, call_limit: int) -> tuple[int, int]:
    wire = Wire("bench-nonce", call_limit)
    wire.sent(types.JSONRPCRequest(jsonrpc="2.0", id=7, method="tools/call", params={"name": "t"}))
    reader = LineReader(wire)
    out = 0
    peak = 0
    for start in range(0, len(data), CHUNK):
        for item in reader.feed(data[start : start + CHUNK]):
            assert isinstance(item, SessionMessage)
            out += 1
        peak = max(peak, reader.pending_bytes)
    return out, peak


def _timed(fn: object, *args: object) -> float:
    start = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start


async def _end_to_end(megabytes: int) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "tools": [{"name": "big", "inputSchema": {"type": "object"}}],
            "answers": {"big": {"huge_text_bytes": megabytes * 1_000_000}},
        }
        data = Path(tmp) / "answer.json"
        data.write_text(json.dumps(spec), encoding="utf-8")
        server = {"name": "big", "command": sys.executable, "args": [str(ANSWERS), str(data)], "allow_tools": ["big"]}
        contract = Contract.model_validate({"contract": {"name": "b", "intent": "b"}, "mcp": {"servers": [server]}})
        async with connect(contract, log_dir=Path(tmp), clock=SystemClock()) as mounts:
            start = time.perf_counter()
            result = await mounts.call(mounts.tools["mcp:big:big"], {}, timeout_s=600)
            return time.perf_counter() - start, str(result.extra.get("refused"))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="5,10,20", help="line sizes in MB (default 5,10,20)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    default_limit = 1_048_576 + ENVELOPE_BYTES
    print(f"{'MB':>4} {'sdk s':>8} {'truss s':>8} {'ratio':>7} {'refusing s':>11} {'ratio':>7} {'held bytes':>11}")
    for megabytes in (int(s) for s in args.sizes.split(",")):
        data = _line(megabytes)
        sdk = statistics.median(_timed(_sdk_reader, data) for _ in range(args.runs))
        whole = statistics.median(_timed(_truss_reader, data, len(data) * 2) for _ in range(args.runs))
        refusing = statistics.median(_timed(_truss_reader, data, default_limit) for _ in range(args.runs))
        _, peak = _truss_reader(data, default_limit)
        print(f"{megabytes:>4} {sdk:>8.3f} {whole:>8.3f} {sdk / whole:>6.1f}x {refusing:>11.4f} "
              f"{sdk / refusing:>6.0f}x {peak:>11}")  # fmt: skip
    seconds, refused = anyio.run(_end_to_end, 50)
    print(f"end to end: a 50 MB one-line answer came back refused={refused} after {seconds:.2f} s")


if __name__ == "__main__":
    main()
