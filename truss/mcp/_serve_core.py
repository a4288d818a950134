"""Values and pure checks of serve-mcp: principals, bearer tokens, contract names, limits.

No I/O beyond reading the tokens file and resolving a contract path; no MCP SDK. The server in
``truss.mcp.server`` uses these at its edges.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truss._errors import InputError, NotFoundError, UsageError
from truss._json import as_dict, as_list, as_loose_mapping, as_mapping

__all__ = [
    "Principal",
    "ServeLimits",
    "TokenTable",
    "derive_session_id",
    "json_depth",
    "resolve_contract",
]

_PRINCIPAL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}\Z")
_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_CONTRACT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
MAX_CONTRACT_NAME = 64
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


@dataclass(frozen=True)
class Principal:
    """Who is asking: a tenant and a user within it. Recorded in ``session_started``."""

    tenant: str
    user: str

    def __post_init__(self) -> None:
        for label, value in (("tenant", self.tenant), ("user", self.user)):
            if not _PRINCIPAL_RE.match(value):
                raise UsageError(
                    f"principal {label} {value!r} is not valid",
                    remedy="Use 1-64 of letters, digits, '.', '_', '@', '-', starting with a letter or digit",
                    field=label,
                )

    def to_json(self) -> dict[str, str]:
        return {"tenant": self.tenant, "user": self.user}

    def owns(self, recorded: Any) -> bool:
        """True when a session's recorded principal is this one (a session without one is nobody's)."""
        given = as_mapping(recorded)
        return given is not None and dict(given) == self.to_json()


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on everything a caller sends or receives (DESIGN 8, STYLE 6)."""

    max_request_bytes: int = 1_048_576  # one JSON-RPC message (stdio line or HTTP body)
    max_nesting_depth: int = 32  # of any request's params
    max_answer_bytes: int = 262_144  # an export larger than this is written to a file and referenced
    max_replay_bytes: int = 16_777_216  # HTTP: the SSE events kept for Last-Event-ID replays, all sessions together
    max_concurrent_runs: int = 4
    max_finished_kept: int = 1_000  # finished runs remembered in memory (errors before a session existed)


class TokenTable:
    """Bearer tokens for HTTP, stored as ``sha256:`` hashes mapped to principals.

    The file is TOML::

        [[tokens]]
        hash = "sha256:<hex of sha256(token)>"
        tenant = "acme"
        user = "ci-bot"

    A presented token is hashed and compared with every entry in constant time (no early exit),
    so timing reveals neither which entry matched nor how much of a hash did.
    """

    def __init__(self, entries: list[tuple[bytes, Principal]]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        try:
            info = path.stat()
            if info.st_size > 1_048_576:
                raise UsageError(f"tokens file {path} is larger than 1 MiB", remedy="Keep only hashed tokens in it")
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read tokens file {path}: {exc.strerror}", remedy="Check the path") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"tokens file {path} is not valid TOML: {exc}", remedy="See docs/serve-mcp.md") from None
        if os.name == "posix" and info.st_mode & 0o022:
            raise UsageError(
                f"tokens file {path} is writable by group or others",
                remedy=f"chmod go-w {path}",
            )
        raw = as_list(data.get("tokens"))
        if set(data) - {"tokens"} or not raw:
            raise UsageError(
                f"tokens file {path} must hold only [[tokens]] tables (hash, tenant, user)",
                remedy="See docs/serve-mcp.md",
            )
        entries: list[tuple[bytes, Principal]] = []
        seen: set[str] = set()
        for i, entry in enumerate(raw):
            where = f"tokens file {path}, entry {i + 1}"
            item = as_dict(entry)
            if item is None or set(item) != {"hash", "tenant", "user"}:
                raise UsageError(f"{where}: needs exactly hash, tenant and user", remedy="See docs/serve-mcp.md")
            hashed, tenant, user = item["hash"], item["tenant"], item["user"]
            if not isinstance(hashed, str) or not _HASH_RE.match(hashed):
                raise UsageError(
                    f"{where}: hash must be 'sha256:' and 64 lower-case hex digits (never the token itself)",
                    remedy='printf %s "$TOKEN" | sha256sum',
                )
            if hashed in seen:
                raise UsageError(f"{where}: the same token hash appears twice", remedy="Remove the duplicate")
            seen.add(hashed)
            if not isinstance(tenant, str) or not isinstance(user, str):
                raise UsageError(f"{where}: tenant and user must be strings", remedy="See docs/serve-mcp.md")
            entries.append((bytes.fromhex(hashed[7:]), Principal(tenant, user)))
        return cls(entries)

    def principal_for(self, token: str | None) -> Principal | None:
        if not token:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for hashed, principal in self._entries:
            if hmac.compare_digest(hashed, digest) and found is None:
                found = principal
        return found

    def principal_for_header(self, authorization: str | None) -> Principal | None:
        """The principal of an ``Authorization: Bearer <token>`` header value, else None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.principal_for(token.strip())


def resolve_contract(contracts_dir: Path, name: str) -> Path:
    """The file of contract ``name`` inside ``contracts_dir``, or ``InputError``/``NotFoundError``.

    A name is never a path: separators, ``..``, absolute paths, NUL and other control bytes,
    over-long names and anything outside ``[a-z0-9-]`` are refused before the file system is
    touched; a file that resolves (through symlinks) outside the directory is refused too.
    """
    reason: str | None = None
    if "\x00" in name:
        reason = "nul_byte"
    elif len(name) > MAX_CONTRACT_NAME:
        reason = "too_long"
    elif name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        reason = "absolute_path"
    elif "/" in name or "\\" in name or os.sep in name:
        reason = "path_separator"
    elif ".." in name:
        reason = "dot_dot"
    elif not _CONTRACT_NAME_RE.match(name):
        reason = "bad_characters"
    if reason is not None:
        raise InputError(
            f"contract {_shown(name)} is not a contract name ({reason.replace('_', ' ')})",
            remedy="Give the name of a contract in the operator's contracts directory, e.g. 'hello', not a path",
            what="contract",
            reason=reason,
        )
    root = contracts_dir.resolve()
    candidate = root / f"{name}.toml"
    try:
        real = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        raise _unknown(name) from None
    if not real.is_relative_to(root):
        raise InputError(
            f"contract {name!r} resolves outside the contracts directory",
            remedy="The operator must replace the symlink with the contract file itself",
            what="contract",
            reason="outside_dir",
        )
    if not real.is_file():
        raise _unknown(name)
    return real


def _unknown(name: str) -> NotFoundError:
    return NotFoundError(
        f"no contract named {name!r}",
        remedy="Ask the operator which contracts this server offers",
        what="contract",
        name=name,
    )


def _shown(name: str) -> str:
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in name[:MAX_CONTRACT_NAME])
    return repr(cleaned + ("…" if len(name) > MAX_CONTRACT_NAME else ""))


def derive_session_id(principal: Principal, key: str) -> str:
    """The session id of a caller's idempotency key: per principal, so keys never collide across them."""
    digest = hashlib.sha256(
        b"truss-serve-session\x00" + "\x00".join((principal.tenant, principal.user, key)).encode()
    ).digest()
    value = int.from_bytes(digest[:17], "big")
    chars: list[str] = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "s_" + "".join(chars)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counting stops once past ``limit`` (iterative: no recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        mapping = as_loose_mapping(item)
        children = list(mapping.values()) if mapping is not None else as_list(item)
        if children is not None:
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
            stack.extend((child, depth + 1) for child in children)
    return deepest
