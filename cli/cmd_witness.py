"""``truss witness init|serve|show``: run a C2SP witness for someone's log (docs/witness.md).

A witness lives in a directory of its own (``--dir``, not a Truss home): its cosigner key(s), the
logs it follows (``config.toml``) and its state (``state.db``). ``serve`` prints one line
``listening on http://HOST:PORT`` on stdout when it accepts connections, and stops cleanly on
SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from truss_cli._ctx import Ctx, row_limit, table
from truss_cli._signals import stop_on_signals

from truss._errors import UsageError
from truss.ledger.keys import ED25519_COSIGNATURE_ALG, MLDSA44_COSIGNATURE_ALG, CosignerKey, mldsa44_available

_CONFIG_TEMPLATE = """\
# The logs this witness follows (docs/witness.md). Add one [[log]] per log, with every verifier key
# it signs checkpoints with (after a key rotation, add the new key beside the old one).
max_per_minute = 60                  # add-checkpoint requests per log per minute (429 beyond)

# [[log]]
# origin = "example.com/truss"       # optional: the keys' name
# keys = ["example.com/truss+1234abcd+AX..."]
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "witness",
        help="run a C2SP witness that cosigns other logs' checkpoints (init, serve, show)",
        description="A witness cosigns a log's checkpoint only after checking it is consistent with every "
        "checkpoint of that log it cosigned before, so the log cannot show two histories. Its state lives "
        "in --dir: its keys, config.toml (the logs it follows) and state.db.",
    )
    commands = p.add_subparsers(dest="witness_command", metavar="ACTION")

    init = commands.add_parser(
        "init",
        help="create a witness directory: its cosigner key and a config to fill in",
        description="Create DIR with the witness's Ed25519 cosigner key (signature type 0x04), and with "
        "--ml-dsa an ML-DSA-44 key too (type 0x06, where the installed cryptography provides it), and a "
        "config.toml listing no log yet. Prints the verifier key(s) for the logs' tlog-policy files.",
    )
    init.add_argument("--dir", required=True, metavar="DIR", help="the witness directory to create")
    init.add_argument("--name", required=True, metavar="NAME", help="the witness's key name, e.g. witness.example/w1")
    init.add_argument("--ml-dsa", action="store_true", help="also create an ML-DSA-44 cosigner key")
    init.set_defaults(handler=init_witness)

    serve = commands.add_parser(
        "serve",
        help="serve the C2SP add-checkpoint API over HTTP",
        description="Serve POST /add-checkpoint and GET /<origin hash>/checkpoint for the logs of "
        "DIR/config.toml. Prints `listening on http://HOST:PORT` once it accepts connections.",
    )
    serve.add_argument("--dir", required=True, metavar="DIR", help="the witness directory")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed)")
    serve.set_defaults(handler=serve_witness)

    show = commands.add_parser(
        "show",
        help="what the witness cosigned, per log, and the evidence it kept",
        description="List, per followed log, the latest checkpoint the witness cosigned. --history lists "
        "every cosigned checkpoint; --evidence the refused, validly signed submissions it kept (a log "
        "that signed an inconsistent checkpoint).",
    )
    show.add_argument("--dir", required=True, metavar="DIR", help="the witness directory")
    show.add_argument("--history", action="store_true", help="every checkpoint cosigned (newest first)")
    show.add_argument("--evidence", action="store_true", help="the refused submissions kept as evidence")
    show.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100; 0 for all)")
    show.set_defaults(handler=show_witness)


def init_witness(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.witness.state import CONFIG_FILE, ED25519_KEY_FILE, MLDSA_KEY_FILE

    directory = Path(args.dir)
    if args.ml_dsa and not mldsa44_available():
        raise UsageError(
            "--ml-dsa: the installed `cryptography` has no ML-DSA-44",
            remedy="install cryptography 46 or later, or leave out --ml-dsa",
        )
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys = [CosignerKey.create(directory / ED25519_KEY_FILE, args.name, ED25519_COSIGNATURE_ALG)]
    if args.ml_dsa:
        keys.append(CosignerKey.create(directory / MLDSA_KEY_FILE, args.name, MLDSA44_COSIGNATURE_ALG))
    config = directory / CONFIG_FILE
    if not config.exists():
        config.write_text(_CONFIG_TEMPLATE, encoding="utf-8")
    short = args.name.rsplit("/", 1)[-1]
    lines = [f"created witness {args.name} in {directory}"]
    for key in keys:
        lines.append(f"{key.verifier.algorithm:<10} {key.verifier.vkey}")
    lines.append("for a log's tlog-policy file (with the URL it will serve at):")
    lines.append(f"  witness {short} {keys[0].verifier.vkey} http://127.0.0.1:PORT")
    ctx.emit(
        {
            "dir": str(directory),
            "name": args.name,
            "keys": [{"algorithm": k.verifier.algorithm, "vkey": k.verifier.vkey} for k in keys],
            "config": str(config),
        },
        "\n".join(lines),
    )
    return 0


def serve_witness(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.witness.server import open_witness, serve

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port number")
    config, state = open_witness(Path(args.dir))

    def ready(host: str, port: int) -> None:
        sys.stdout.write(f"listening on http://{host}:{port}\n")
        sys.stdout.flush()
        ctx.progress(f"truss: witness of {len(config.logs)} log(s); stop with Ctrl-C")

    with stop_on_signals() as stop:
        try:
            with state:
                serve(config, state, ctx.clock, host=args.host, port=args.port, ready=ready, stop=stop)
        except OSError as exc:
            message = f"cannot listen on {args.host}:{args.port}: {exc.strerror}"
            raise UsageError(message, remedy="choose another port, or stop what holds it") from exc
    return 0


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def show_witness(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.witness.server import open_witness

    row_limit(args.limit)  # a negative number is refused; 0 means all
    config, state = open_witness(Path(args.dir))
    with state:
        latest = {c.origin: c for c in state.latest()}
        history = state.history(limit=args.limit) if args.history else []
        evidence = state.evidence(limit=args.limit)
    rows: list[list[str]] = []
    for origin in sorted(set(config.logs) | set(latest)):
        held = latest.get(origin)
        if held is None:
            rows.append([origin, "-", "-", "-"])
        else:
            rows.append([origin, str(held.size), held.root.hex()[:16], _when(held.ts)])
    lines = [table(rows, ["LOG", "SIZE", "ROOT", "COSIGNED (UTC)"]) if rows else "no log followed yet"]
    if args.history:
        lines.append("")
        cosigned = [[c.origin, str(c.size), c.root.hex()[:16], _when(c.ts)] for c in history]
        lines.append(table(cosigned, ["LOG", "SIZE", "ROOT", "AT"]) if history else "nothing cosigned yet")
    lines.append(f"{len(evidence)} refused submission(s) kept as evidence" + ("" if args.evidence else " (--evidence)"))
    if args.evidence:
        for item in evidence:
            lines.append(
                f"  #{item.id} {_when(item.received_ms)} {item.origin} size {item.size} (old {item.old_size}): "
                f"HTTP {item.status} {item.reason}"
            )
    data: dict[str, Any] = {
        "dir": str(config.directory),
        "logs": [
            {
                "origin": origin,
                "size": None if (held := latest.get(origin)) is None else held.size,
                "root": None if held is None else held.root.hex(),
                "cosigned_ms": None if held is None else held.ts,
                "note": None if held is None else held.note.decode("utf-8", errors="replace"),
            }
            for origin in sorted(set(config.logs) | set(latest))
        ],
        "evidence_count": len(evidence),
    }
    if args.history:
        data["history"] = [{"origin": c.origin, "size": c.size, "root": c.root.hex(), "ts": c.ts} for c in history]
    if args.evidence:
        data["evidence"] = [
            {
                "id": e.id,
                "origin": e.origin,
                "received_ms": e.received_ms,
                "reason": e.reason,
                "status": e.status,
                "old_size": e.old_size,
                "size": e.size,
                "root": e.root.hex(),
                "submitted": e.request.decode("utf-8", errors="replace"),
                "held": None if e.held_note is None else e.held_note.decode("utf-8", errors="replace"),
            }
            for e in evidence
        ]
    ctx.emit(data, "\n".join(lines))
    return 0
