"""The four tools serve-mcp advertises: their definitions and the checking of their arguments.

Definitions (names, schemas, annotations) are data; ``parse_*`` turn a caller's untrusted
``arguments`` into typed requests or raise ``InputError`` naming the field. Nothing here runs a
contract or reads the ledger; ``truss.mcp.server`` does that.

Annotations are honest: ``truss_run_contract`` runs whatever the operator's contract allows,
which may include destructive tools of third-party servers, so it is marked destructive and
open-world; the three read tools only read the ledger (an export may be cached as a file under
the Truss home, which changes nothing a caller can observe).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from truss._errors import InputError
from truss._json import as_loose_mapping

__all__ = [
    "BUDGET_KEYS",
    "EXPORT",
    "RUN",
    "STATUS",
    "TOOL_NAMES",
    "VERDICT",
    "RunRequest",
    "parse_run",
    "parse_session",
    "tool_definitions",
]

RUN = "truss_run_contract"
STATUS = "truss_contract_status"
VERDICT = "truss_ledger_verdict"
EXPORT = "truss_ledger_export"
TOOL_NAMES = (RUN, STATUS, VERDICT, EXPORT)

_SESSION_ID_SCHEMA = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""The session-id pattern as JSON Schema writes it (ECMA-262, where '$' is the end of the text)."""
SESSION_ID_RE = re.compile(_SESSION_ID_SCHEMA[:-1] + r"\Z")  # Python's '$' would accept a final newline
PARAM_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}\Z")
_MAX_PARAMS = 64
_MAX_PARAM_TEXT = 10_000

# Budget keys a caller may lower, and the JSON type of each (durations are strings like "30s").
BUDGET_KEYS: dict[str, str] = {
    "max_tool_calls": "integer",
    "max_model_turns": "integer",
    "max_tokens": "integer",
    "deadline": "string",
    "call_timeout": "string",
    "max_result_bytes": "integer",
}

_SESSION_PROP = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "pattern": _SESSION_ID_SCHEMA,
    "description": "A session id returned by truss_run_contract.",
}

_NULLABLE_STR = {"type": ["string", "null"]}

_RUN_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "contract": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "description": "The name of a contract in the operator's contracts directory (not a path), e.g. 'hello'.",
        },
        "params": {
            "type": "object",
            "description": "Values for the contract's declared [contract.params]; checked against their specs.",
            "additionalProperties": {"type": ["string", "number", "integer", "boolean"]},
        },
        "session_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 128,
            "pattern": _SESSION_ID_SCHEMA,
            "description": (
                "An idempotency key or a session id you got back. Repeating it returns that session; "
                "it never starts a second run."
            ),
        },
        "async": {
            "type": "boolean",
            "default": False,
            "description": "Return the session handle at once; poll truss_contract_status.",
        },
        "budget": {
            "type": "object",
            "description": "Lower some of the contract's limits for this run (raising one is refused).",
            "properties": {
                key: ({"type": "integer", "minimum": 0} if kind == "integer" else {"type": "string"})
                for key, kind in BUDGET_KEYS.items()
            },
            "additionalProperties": False,
        },
    },
    "required": ["contract"],
    "additionalProperties": False,
}

_RUN_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "session": {"type": "string"},
        "status": {
            "type": "string",
            "description": "running | pass | fail | error | suspended | interrupted | diverged",
        },
        "verdict": {"type": ["object", "null"]},
        "head": _NULLABLE_STR,
        "checkpoint": _NULLABLE_STR,
        "bundle_ref": {
            "type": ["object", "null"],
            "description": "How to fetch the evidence bundle: call truss_ledger_export with this session.",
        },
        "reason": _NULLABLE_STR,
        "waiting": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Calls waiting for the operator's `truss approve` when the run is suspended.",
        },
        "waiting_on": {
            "type": ["string", "null"],
            "description": "What a suspended run waits for: approval, in_doubt, signal, task, interrupted.",
        },
    },
    "required": ["session", "status", "verdict", "head", "checkpoint", "bundle_ref"],
}

_STATUS_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "session": {"type": "string"},
        "status": {"type": "string"},
        "running": {"type": "boolean"},
        "contract": _NULLABLE_STR,
        "counts": {"type": "object"},
        "budget_used": {"type": "object"},
        "progress": {"type": ["object", "null"]},
        "head": _NULLABLE_STR,
        "verification": {"type": ["object", "null"]},
    },
    "required": ["session", "status", "running", "counts", "budget_used", "head", "verification"],
}

_VERDICT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "session": {"type": "string"},
        "status": {"type": "string"},
        "envelope": {"type": "object", "description": "DSSE envelope holding an in-toto Statement v1."},
    },
    "required": ["session", "status", "envelope"],
}

_EXPORT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "session": {"type": "string"},
        "bytes": {"type": "integer"},
        "sha256": {"type": "string"},
        "inline": {"type": "boolean"},
        "bundle": {"type": ["object", "null"], "description": "The bundle itself when it fits the answer limit."},
        "path": {
            "type": ["string", "null"],
            "description": "Where the bundle was written on the Truss host when it is too large to inline.",
        },
    },
    "required": ["session", "bytes", "sha256", "inline"],
}

_READ_ANNOTATIONS = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


def _session_input() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"session": dict(_SESSION_PROP)},
        "required": ["session"],
        "additionalProperties": False,
    }


def tool_definitions() -> list[dict[str, Any]]:
    """The wire form of the four tools, in a stable order."""
    return [
        {
            "name": RUN,
            "title": "Run a Truss contract",
            "description": (
                "Run a contract from the operator's contracts directory through Truss's audited gate and "
                "return its signed verdict, ledger head and checkpoint. Failures of the run come back as "
                "isError results."
            ),
            "inputSchema": _RUN_INPUT,
            "outputSchema": _RUN_OUTPUT,
            "annotations": {
                "title": "Run a Truss contract",
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": False,
                "openWorldHint": True,
            },
        },
        {
            "name": STATUS,
            "title": "Status of a Truss session",
            "description": "Status, progress, counts, budget used, head hash and ledger verification of a session.",
            "inputSchema": _session_input(),
            "outputSchema": _STATUS_OUTPUT,
            "annotations": {"title": "Status of a Truss session", **_READ_ANNOTATIONS},
        },
        {
            "name": VERDICT,
            "title": "Verdict envelope of a Truss session",
            "description": "The signed verdict of a finished session: a DSSE envelope with an in-toto Statement.",
            "inputSchema": _session_input(),
            "outputSchema": _VERDICT_OUTPUT,
            "annotations": {"title": "Verdict envelope of a Truss session", **_READ_ANNOTATIONS},
        },
        {
            "name": EXPORT,
            "title": "Evidence bundle of a Truss session",
            "description": (
                "The session's self-contained, offline-verifiable bundle (entries, payloads, verdict, "
                "checkpoint, inclusion proof). A bundle larger than the answer limit is referenced, not inlined."
            ),
            "inputSchema": _session_input(),
            "outputSchema": _EXPORT_OUTPUT,
            # Not read-only: when no checkpoint covers the session yet (a suspended run), the export
            # signs one and stores it. It changes no recorded entry, and asking again gives that checkpoint.
            "annotations": {
                "title": "Evidence bundle of a Truss session",
                **_READ_ANNOTATIONS,
                "readOnlyHint": False,
            },
        },
    ]


@dataclass(frozen=True)
class RunRequest:
    contract: str
    params: dict[str, str | int | float | bool]
    session_id: str | None
    run_async: bool
    budget: dict[str, int | str]


def _refuse(field: str, problem: str, **fields: Any) -> InputError:
    return InputError(
        f"argument {field}: {problem}",
        remedy="See the tool's inputSchema",
        field=field,
        **fields,
    )


def _check_keys(arguments: Mapping[str, Any], allowed: set[str], required: set[str]) -> None:
    for key in arguments:
        if key not in allowed:
            raise _refuse(_printable(key, 64), "is not an argument of this tool", reason="unknown_argument")
    for key in sorted(required):
        if key not in arguments:
            raise _refuse(key, "is required", reason="missing_argument")


def _printable(text: str, limit: int) -> str:
    """A caller's string made safe to echo in a message: no control characters, bounded length."""
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
    return cleaned + ("…" if len(text) > limit else "")


def parse_session(arguments: Mapping[str, Any]) -> str:
    _check_keys(arguments, {"session"}, {"session"})
    value = arguments["session"]
    if not isinstance(value, str) or not SESSION_ID_RE.match(value):
        raise _refuse("session", "must be a session id (1-128 of letters, digits, '.', '_', '-')", reason="bad_type")
    return value


def parse_run(arguments: Mapping[str, Any]) -> RunRequest:
    """Check the shape of a ``truss_run_contract`` call; the contract name is checked later."""
    _check_keys(arguments, {"contract", "params", "session_id", "async", "budget"}, {"contract"})
    contract = arguments["contract"]
    if not isinstance(contract, str):
        raise _refuse("contract", "must be a string", reason="bad_type")

    params: dict[str, str | int | float | bool] = {}
    raw_params = arguments.get("params")
    if raw_params is not None:
        typed = as_loose_mapping(raw_params)
        if typed is None:
            raise _refuse("params", "must be an object", reason="bad_type")
        if len(typed) > _MAX_PARAMS:
            raise _refuse("params", f"has more than {_MAX_PARAMS} entries", reason="too_many")
        for key, value in typed.items():
            if not isinstance(key, str) or not PARAM_NAME_RE.match(key):
                raise _refuse("params", f"{_printable(str(key), 64)!r} is not a parameter name", reason="bad_name")
            if not isinstance(value, str | int | float | bool):
                raise _refuse(f"params.{key}", "must be a string, number or boolean", reason="bad_type")
            if isinstance(value, str) and len(value) > _MAX_PARAM_TEXT:
                raise _refuse(f"params.{key}", f"is longer than {_MAX_PARAM_TEXT} characters", reason="too_long")
            params[key] = value

    session_id = arguments.get("session_id")
    if session_id is not None and (not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id)):
        raise _refuse(
            "session_id", "must be 1-128 of letters, digits, '.', '_', '-' (starting with one of the first two)"
        )

    run_async = arguments.get("async", False)
    if not isinstance(run_async, bool):
        raise _refuse("async", "must be true or false", reason="bad_type")

    budget: dict[str, int | str] = {}
    raw_budget = arguments.get("budget")
    if raw_budget is not None:
        typed_budget = as_loose_mapping(raw_budget)
        if typed_budget is None:
            raise _refuse("budget", "must be an object", reason="bad_type")
        for key, value in typed_budget.items():
            kind = BUDGET_KEYS.get(key) if isinstance(key, str) else None
            if kind is None or not isinstance(key, str):
                raise _refuse(
                    "budget",
                    f"{_printable(str(key), 64)!r} is not a limit a caller may set (one of {', '.join(BUDGET_KEYS)})",
                    reason="unknown_limit",
                )
            if kind == "integer":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise _refuse(f"budget.{key}", "must be a non-negative integer", reason="bad_type")
            elif not isinstance(value, str) or len(value) > 32:
                raise _refuse(f"budget.{key}", "must be a duration such as '30s' or '5m'", reason="bad_type")
            budget[key] = value

    return RunRequest(
        contract=contract,
        params=params,
        session_id=session_id,
        run_async=run_async,
        budget=budget,
    )
