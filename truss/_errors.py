"""The one exception tree of Truss.

Every error Truss raises on purpose is a ``TrussError``. Foreign exceptions (the MCP SDK, httpx2,
sqlite3, PyNaCl, pydantic, the OS) are mapped to one of these at the edge that sees them, most
specific first, so the CLI and serve-mcp need exactly one handler::

    TrussError                          exit 4 unless a subclass says otherwise
    ├── InputError                      exit 2: something the operator gave is unusable
    │   ├── ContractError               a contract/config/overlay file: file, key path, line
    │   ├── UsageError                  command-line arguments
    │   ├── KeyFileError                identity key missing, malformed or readable by others
    │   ├── BundleFormatError           a bundle, checkpoint or envelope that cannot be parsed
    │   ├── PolicyError                 a witness config or tlog-policy file that cannot be used
    │   └── NotFoundError               an unknown session, call or contract name
    ├── VerificationError               exit 1: a ledger, bundle, note or envelope does not verify
    ├── SessionBusyError                exit 3: another process holds the session's lease
    ├── RunSuspended                    exit 3: waiting for approval, a signal, a task or `resolve`
    │   └── InDoubtError                an intent without a result that may not be re-sent
    ├── RuntimeFailure                  exit 4: the work could not be done
    │   ├── StoreError                  the ledger store failed
    │   │   ├── StoreConflictError      another writer recorded this step (UNIQUE violated)
    │   │   └── StoreBusyError          the store is locked by another process for too long
    │   ├── McpError                    an MCP server or transport failed (server, tool, retryable)
    │   │   ├── ServerStartError        could not start or connect a server
    │   │   │   ├── SandboxError        a server's sandbox cannot be set up (cause, remedy)
    │   │   │   └── LoginRequiredError  exit 5: an OAuth server needs `truss mcp login` first
    │   │   ├── ToolNotAdvertisedError  an allowlisted tool the server does not list
    │   │   ├── PinMismatchError        a tool definition differs from its pin (expected, actual)
    │   │   └── ToolCallError           a call failed (timeout, connection closed, protocol error)
    │   ├── ProviderError               a model provider failed (status, retryable)
    │   ├── WitnessError                witnesses did not cosign a checkpoint to the quorum (retryable)
    │   └── ReplayDivergenceError       a resumed run asked for something the ledger did not record
    └── QuotaExceededError              exit 6: a quota across runs has no room for this run (yet)

Tests assert on types and fields, never on message text. ``diagnostics()`` is the one-paragraph
text users see: what is wrong, where, and what to do about it. Messages never hold secret values:
callers pass names and hashes, not values.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BundleFormatError",
    "ContractError",
    "InDoubtError",
    "InputError",
    "KeyFileError",
    "LoginRequiredError",
    "McpError",
    "NotFoundError",
    "PinMismatchError",
    "PolicyError",
    "ProviderError",
    "QuotaExceededError",
    "ReplayDivergenceError",
    "RunSuspended",
    "RuntimeFailure",
    "SandboxError",
    "ServerStartError",
    "SessionBusyError",
    "StoreBusyError",
    "StoreConflictError",
    "StoreError",
    "ToolCallError",
    "ToolNotAdvertisedError",
    "TrussError",
    "UsageError",
    "VerificationError",
    "WitnessError",
]


class TrussError(Exception):
    """Base of every error Truss raises on purpose.

    ``message`` says what is wrong and where; ``remedy`` says what to do. ``fields`` holds the
    structured facts (tool, server, limit, seq, ...) that tests and ``--json`` output use.
    """

    exit_code: ClassVar[int] = 4
    kind: ClassVar[str] = "error"

    def __init__(self, message: str, *, remedy: str | None = None, retryable: bool = False, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        self.retryable = retryable
        self.fields: dict[str, Any] = fields

    def __getattr__(self, name: str) -> Any:
        # Structured fields read as attributes (err.server, err.tool); absent ones are None.
        fields: dict[str, Any] = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def diagnostics(self) -> str:
        """One paragraph for a person: the problem, then the fix."""
        text = self.message.rstrip(".") + "."
        if self.remedy:
            text += " " + self.remedy.rstrip(".") + "."
        return text

    def to_json(self) -> dict[str, Any]:
        """A machine-readable form for ``--json`` output and serve-mcp answers."""
        out: dict[str, Any] = {
            "error": type(self).__name__,
            "kind": self.kind,
            "message": self.message,
            "exit_code": self.exit_code,
            "retryable": self.retryable,
        }
        if self.remedy:
            out["remedy"] = self.remedy
        out.update({k: v for k, v in self.fields.items() if _jsonable(v)})
        return out


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


# -- exit 2: unusable input -------------------------------------------------------------------


class InputError(TrussError):
    """Something the operator gave (file, argument, key, bundle) cannot be used as it is."""

    exit_code = 2
    kind = "bad_input"


class ContractError(InputError):
    """A contract, operator config, agent config or overlay is invalid.

    Fields: ``file``, ``path`` (the key path, e.g. ``mcp.servers[0].allow_tools``), ``line``.
    """

    kind = "bad_contract"

    def diagnostics(self) -> str:
        where = self.fields.get("file") or "<contract>"
        line = self.fields.get("line")
        column = self.fields.get("column")
        if line is not None:
            where += f":{line}" + (f":{column}" if column is not None else "")
        path = self.fields.get("path")
        if path:
            where += f" at {path}"
        return f"{where}: {super().diagnostics()}"


class UsageError(InputError):
    """Command-line arguments are missing, malformed or contradictory."""

    kind = "usage"


class KeyFileError(InputError):
    """The identity key is missing, malformed, or readable by group or others (``file``)."""

    kind = "bad_key"


class BundleFormatError(InputError):
    """A bundle, checkpoint, note or envelope cannot be parsed at all (``file``, ``reason``)."""

    kind = "bad_bundle"


class PolicyError(InputError):
    """A witness config or a C2SP tlog-policy file cannot be used (``file``, ``line``)."""

    kind = "bad_policy"

    def diagnostics(self) -> str:
        where = self.fields.get("file") or "<policy>"
        line = self.fields.get("line")
        if line is not None:
            where += f":{line}"
        return f"{where}: {super().diagnostics()}"


class NotFoundError(InputError):
    """An unknown session, call, contract name or server (``what``, ``name``)."""

    kind = "not_found"


# -- exit 1: does not verify ------------------------------------------------------------------


class VerificationError(TrussError):
    """A ledger, bundle, checkpoint or envelope does not verify.

    Fields: ``session``, ``seq``, ``index`` (first bad position, when known) and ``reason`` (a
    stable code such as ``bad_signature``, ``prev_mismatch``, ``seq_gap``).
    """

    exit_code = 1
    kind = "verification_failed"


# -- exit 3: waiting --------------------------------------------------------------------------


class RunSuspended(TrussError):
    """The run is waiting for something outside it: an approval, a signal, a task, ``resolve``.

    Fields: ``session``, ``reason`` (``approval``, ``signal``, ``task``, ``in_doubt``,
    ``interrupted``, ``no_wait``), ``call`` (the call id it waits on, when there is one).
    """

    exit_code = 3
    kind = "suspended"


class SessionBusyError(TrussError):
    """Another process is driving this session (it holds the session's lease).

    Fields: ``session``, ``owner``, ``host``, ``pid``, ``since_ms``, ``expires_ms``.
    """

    exit_code = 3
    kind = "session_busy"


# -- exit 4: the work could not be done -------------------------------------------------------


class RuntimeFailure(TrussError):
    """The work could not be done (a server, a provider, the store, the deadline)."""

    exit_code = 4
    kind = "runtime"


class StoreError(RuntimeFailure):
    """The ledger store failed to read or write (``db``)."""

    kind = "store"


class StoreConflictError(StoreError):
    """Another writer already recorded this step (``session``, ``seq`` or ``index``)."""

    kind = "store_conflict"


class StoreBusyError(StoreError):
    """The store stayed locked by another process past the busy timeout."""

    kind = "store_busy"
    # Waiting again may succeed once the other writer finishes.


class McpError(RuntimeFailure):
    """An MCP server or its transport failed. Fields: ``server``, ``tool``, ``cause``."""

    kind = "mcp"


class ServerStartError(McpError):
    """A server could not be started or connected (bad command, exit at start, refused, 401)."""

    kind = "server_start"


class LoginRequiredError(ServerStartError):
    """An OAuth server needs a person to log in (or to consent to more scopes), and this command
    never waits for one: ``truss mcp login SERVER`` first. Exit 5. Fields: ``server``, ``issuer``
    when known, ``cause`` (``no_credentials``, ``refresh_failed``, ``step_up``)."""

    kind = "login_required"
    exit_code = 5


class SandboxError(ServerStartError):
    """A stdio server's sandbox cannot be set up, so the server is not started.

    Fields: ``server``, ``cause`` (a stable code: ``not_linux``, ``bwrap_missing``,
    ``bwrap_unusable``, ``bwrap_too_old``, ``userns_unavailable``, ``unresolvable``,
    ``protected_path``, ``exposes_ledger``, ``aliased_bind``, ``runtime_dir``, ``limit_unenforceable``), ``path`` where
    one is involved. Never a fallback: a profile that is ``required`` refuses to start the server
    instead of running it unconfined.
    """

    kind = "sandbox"


class ToolNotAdvertisedError(McpError):
    """An allowlisted tool is not in the server's tool list (``server``, ``tool``, ``advertised``)."""

    kind = "tool_not_advertised"


class PinMismatchError(McpError):
    """A tool's definition hash differs from the pinned one (``expected``, ``actual``)."""

    kind = "pin_mismatch"


class ToolCallError(McpError):
    """A tool call failed below the tool: ``cause`` is ``timeout``, ``connection_closed``,
    ``server_error`` (the server answered with a JSON-RPC error: ``code``), ``protocol_error``,
    ``transport`` or ``invalid_result``."""

    kind = "tool_call"


class ProviderError(RuntimeFailure):
    """A model provider failed (``provider``, ``status``, ``attempts``)."""

    kind = "provider"


class WitnessError(RuntimeFailure):
    """The witnesses did not cosign a checkpoint to the policy's quorum (``short``: the groups
    that are short, ``outcomes``: each witness's answer). Retrying later may succeed."""

    kind = "witness"


class ReplayDivergenceError(RuntimeFailure):
    """A resumed run asked for something other than what the ledger recorded.

    Fields: ``session``, ``seq`` (the recorded step), ``expected`` and ``actual`` (what each
    side describes, as short text: kind, tool, request hash).
    """

    kind = "diverged"


class InDoubtError(RunSuspended):
    """A call has an intent but no result and its tool is not declared safe to re-send.

    Fields: ``session``, ``call``, ``tool``. Resolve with ``truss resolve``.
    """

    kind = "in_doubt"


# -- exit 6: a quota across runs refused the run ----------------------------------------------


class QuotaExceededError(TrussError):
    """A run's reservation does not fit a quota across runs; nothing was started or recorded but
    the refusal itself.

    Fields: ``quota`` (its name or description), ``dimension`` (``runs``, ``tool_calls``,
    ``tokens``), ``limit``, ``used``, ``requested``, ``frees_at_ms`` (when enough frees up for this
    run, or None when time alone will not do it), ``held_by`` (sessions whose unsettled
    reservations hold it), ``retryable``.
    """

    exit_code = 6
    kind = "quota"
