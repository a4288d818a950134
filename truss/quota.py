"""Quotas across runs: pure accounting of reservations and settlements over sliding windows.

A quota (``truss.contract.Quota``: ``[[harness.quotas]]`` of the operator, ``[[quotas]]`` of a
contract) limits what many runs spend together over a window: runs, tool calls, model tokens.
Before a run starts its worst case (its own budget limits) is *reserved*; when its session ends
the reservation is *settled* to what the session recorded. Both are signed entries of the
log-level session ``@quota`` (``quota_reserved``, ``quota_settled``); this module folds those
entries into a ``QuotaBook`` and decides, from values only:

- ``charges_for(contract, principal)``: the keys a run counts against and its worst case on each;
- ``QuotaBook.decide(charges, limits, now_ms)``: whether the reservation fits every quota, or the
  first quota it would exceed and when enough of that quota frees up;
- ``used_by(entries, charges)``: what a finished session spent on each key (its settlement).

Rules (docs/contracts.md "Quotas" is the user's form):

- A key names one counter: who wrote the quota (the operator, or contract NAME), what it counts
  per (contract, principal, server, tool) and the value of that, and the window. Limits are not
  part of the key: they are read from the configuration when a reservation is decided, so an
  operator who lowers a limit holds every later run to it at once.
- An unsettled reservation counts in full whatever its age (a run still going, suspended, or in
  doubt keeps what it reserved until its session ends). A settled one counts what was used,
  until ``window`` after the reservation's time.
- Time never goes backwards: every entry is stamped with the later of the clock and the last
  entry's stamp (``stamp``), and ``now`` is taken the same way, so setting the clock back can
  neither shorten a window nor free a quota early.
- A reservation without a session past its ``release_ms`` (the run's deadline: a run that never
  recorded ``session_started`` by then never will) is released with nothing used.

What it does not do: read the store, append, or read the clock. ``truss._quota_book`` is the edge
that does, inside one compare-and-set append on ``@quota``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from truss._json import as_dict, as_list
from truss.contract import Contract, Quota, duration_ms
from truss.ledger.canonical import canonical
from truss.ledger.entry import ZERO_HASH
from truss.tools import split_namespaced

__all__ = [
    "QUOTA_SESSION",
    "Amounts",
    "Charge",
    "QuotaBook",
    "Refusal",
    "Reservation",
    "UsageTally",
    "charges_for",
    "key_scope",
    "limits_for",
    "quota_label",
    "quotas_of",
    "used_by",
]

QUOTA_SESSION = "@quota"
"""The log-level session holding every reservation and settlement (``@``: never a run's id)."""

DIMENSIONS = ("runs", "tool_calls", "tokens")


@dataclass(frozen=True)
class Amounts:
    """Runs, tool calls and model tokens; ``None`` in a limit means that dimension is not limited."""

    runs: int = 0
    tool_calls: int = 0
    tokens: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.runs + other.runs, self.tool_calls + other.tool_calls, self.tokens + other.tokens)

    def get(self, dimension: str) -> int:
        return int(getattr(self, dimension))

    def to_json(self) -> dict[str, int]:
        return {"runs": self.runs, "tool_calls": self.tool_calls, "tokens": self.tokens}

    @staticmethod
    def from_json(data: Any) -> Amounts:
        body = as_dict(data) or {}
        values = [body.get(d) for d in DIMENSIONS]
        return Amounts(*(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0 for v in values))


@dataclass(frozen=True)
class Charge:
    """What one run counts against one key: its worst case (``amount``) and the window."""

    key: str
    quota: str  # the quota's label, for messages and ``truss status``
    window_ms: int
    amount: Amounts
    unbounded: tuple[str, ...] = ()  # dimensions the run's budget does not bound (tokens without max_tokens)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "quota": self.quota, "window_ms": self.window_ms, **self.amount.to_json()}


@dataclass(frozen=True)
class Limit:
    """The configured limit of one key: per dimension, None when not limited."""

    key: str
    quota: str
    window_ms: int
    runs: int | None
    tool_calls: int | None
    tokens: int | None

    def get(self, dimension: str) -> int | None:
        value: int | None = getattr(self, dimension)
        return value


@dataclass(frozen=True)
class Refusal:
    """Why a reservation does not fit: the quota, the dimension, the numbers, and when it frees up.

    ``frees_at_ms`` is the earliest time at which enough settled use leaves the window for this
    run to fit; None when that never happens by time alone (unsettled runs hold it, or the run's
    worst case is beyond the limit by itself).
    """

    quota: str
    key: str
    dimension: str
    limit: int
    used: int
    requested: int
    frees_at_ms: int | None
    held_by: tuple[str, ...] = ()  # sessions whose unsettled reservations hold this quota
    unbounded: bool = False


@dataclass
class Reservation:
    """One run's reservation as the book holds it."""

    session: str
    at_ms: int
    release_ms: int
    charges: dict[str, Amounts]
    windows: dict[str, int]
    labels: dict[str, str]
    contract: str | None = None
    principal: Any = None
    settled: dict[str, Amounts] | None = None
    settled_ms: int | None = None

    def counted(self, key: str) -> Amounts:
        if self.settled is not None:
            return self.settled.get(key, Amounts())
        return self.charges.get(key, Amounts())

    def expires_ms(self, key: str) -> int | None:
        """When this reservation stops counting against ``key`` (None: not until it is settled)."""
        if self.settled is None:
            return None
        return self.at_ms + self.windows.get(key, 0)


@dataclass
class QuotaBook:
    """The ``@quota`` entries folded: every reservation, settled or not, by session."""

    reservations: dict[str, Reservation] = field(default_factory=dict[str, Reservation])
    limits: dict[str, dict[str, int | None]] = field(default_factory=dict[str, dict[str, int | None]])
    last_ms: int = 0
    seq: int = 0  # the next seq of ``@quota`` (what the fold has read)
    head: str = ZERO_HASH  # the hash of the last entry folded (the next one must link to it)

    def stamp(self, now_ms: int) -> int:
        """The time the next entry gets: never before the last entry's (the clock may go back)."""
        return max(now_ms, self.last_ms)

    def apply(self, kind: str, body: Mapping[str, Any], seq: int) -> None:
        """Fold one ``@quota`` entry (entries are read in seq order)."""
        self.seq = seq + 1
        at = body.get("at_ms")
        if isinstance(at, int) and not isinstance(at, bool):
            self.last_ms = max(self.last_ms, at)
        session = body.get("session")
        if not isinstance(session, str):
            return
        if kind == "quota_reserved":
            charges: dict[str, Amounts] = {}
            windows: dict[str, int] = {}
            labels: dict[str, str] = {}
            for raw in as_list(body.get("charges")) or []:
                item = as_dict(raw)
                if item is None or not isinstance(item.get("key"), str):
                    continue
                key = str(item["key"])
                charges[key] = Amounts.from_json(item)
                window = item.get("window_ms")
                windows[key] = window if isinstance(window, int) and not isinstance(window, bool) else 0
                labels[key] = str(item.get("quota") or key)
                limit = as_dict(item.get("limit"))
                if limit is not None:
                    self.limits[key] = {d: _count(limit.get(d)) for d in DIMENSIONS}
            release = body.get("release_ms")
            self.reservations[session] = Reservation(
                session=session,
                at_ms=at if isinstance(at, int) and not isinstance(at, bool) else self.last_ms,
                release_ms=release if isinstance(release, int) and not isinstance(release, bool) else 0,
                charges=charges,
                windows=windows,
                labels=labels,
                contract=body.get("contract") if isinstance(body.get("contract"), str) else None,
                principal=body.get("principal"),
            )
        elif kind == "quota_settled":
            reservation = self.reservations.get(session)
            if reservation is None or reservation.settled is not None:
                return
            used = as_dict(body.get("used")) or {}
            reservation.settled = {key: Amounts.from_json(used.get(key)) for key in reservation.charges}
            reservation.settled_ms = at if isinstance(at, int) and not isinstance(at, bool) else self.last_ms

    def fold(self, entries: Iterable[Any]) -> QuotaBook:
        """Apply stored entries (anything with ``kind``, ``body``, ``seq``) in order."""
        for entry in entries:
            self.apply(entry.kind, entry.body, entry.seq)
        return self

    def prune(self) -> None:
        """Forget settled reservations that count against nothing any more (at the last stamp)."""
        now = self.last_ms
        gone = [
            s for s, r in self.reservations.items()
            if r.settled is not None and all((r.expires_ms(k) or 0) <= now for k in r.charges)
        ]  # fmt: skip
        for session in gone:
            del self.reservations[session]

    def unsettled(self) -> list[Reservation]:
        return [r for r in self.reservations.values() if r.settled is None]

    def use(self, key: str, now_ms: int) -> Amounts:
        """What counts against ``key`` at ``now_ms``: each reservation's ``counted`` until it ``expires_ms``."""
        total = Amounts()
        for reservation in self.reservations.values():
            expires = reservation.expires_ms(key)
            if key in reservation.charges and (expires is None or expires > now_ms):
                total += reservation.counted(key)
        return total

    def frees_at(self, key: str, dimension: str, need: int, now_ms: int) -> int | None:
        """The earliest time at which ``need`` of ``dimension`` has left ``key``'s window (None: never by time)."""
        if need <= 0:
            return now_ms
        leaving = sorted(
            (expires, r.counted(key).get(dimension))
            for r in self.reservations.values()
            if key in r.charges and (expires := r.expires_ms(key)) is not None and expires > now_ms
        )
        freed = 0
        for expires, amount in leaving:
            freed += amount
            if freed >= need:
                return expires
        return None

    def decide(self, charges: Sequence[Charge], limits: Mapping[str, Limit], now_ms: int) -> Refusal | None:
        """None when ``charges`` fit every limit at ``now_ms``; else the first quota they would exceed."""
        now = self.stamp(now_ms)
        for charge in charges:
            limit = limits.get(charge.key)
            if limit is None:
                continue
            used = self.use(charge.key, now)
            for dimension in DIMENSIONS:
                cap = limit.get(dimension)
                if cap is None:
                    continue
                requested = charge.amount.get(dimension)
                if dimension in charge.unbounded:
                    return Refusal(charge.quota, charge.key, dimension, cap, used.get(dimension), requested,
                                   None, unbounded=True)  # fmt: skip
                have = used.get(dimension)
                if have + requested <= cap:
                    continue
                frees = None if requested > cap else self.frees_at(charge.key, dimension, have + requested - cap, now)
                held = tuple(
                    r.session for r in self.unsettled() if r.charges.get(charge.key, Amounts()).get(dimension) > 0
                )
                return Refusal(charge.quota, charge.key, dimension, cap, have, requested, frees, held)
        return None

    def stale(self, now_ms: int, live: Mapping[str, bool | None]) -> list[Reservation]:
        """Unsettled reservations to release: no session (``live[s]`` None) and past their ``release_ms``."""
        now = self.stamp(now_ms)
        return [r for r in self.unsettled() if live.get(r.session, False) is None and r.release_ms <= now]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def quota_label(quota: Quota, *, owner: str) -> str:
    """How a quota is named in messages: its ``name``, else what it counts."""
    if quota.name:
        return quota.name
    what = {"contract": "per contract", "principal": "per principal"}.get(quota.per)
    if quota.per == "server":
        what = f"server {quota.server}" if quota.server else "per server"
    elif quota.per == "tool":
        what = f"tool {quota.tool}"
    return f"{owner} quota {what} over {quota.window}"


def quotas_of(contract: Contract) -> list[tuple[str, Quota]]:
    """Every quota that applies to a run of ``contract``: the operator's, then the contract's own."""
    out: list[tuple[str, Quota]] = [("operator", q) for q in contract.harness.quotas or []]
    out += [(f"contract {contract.contract.name}", q) for q in contract.quotas or []]
    return out


def _scope(owner: str, contract: Contract, quota: Quota, principal: Any) -> list[tuple[str, str | None, str | None]]:
    """The counters a run touches under one quota: (key part, server, tool)."""
    name = contract.contract.name
    prefix = "operator" if owner == "operator" else f"contract={name}"
    window = duration_ms(quota.window)
    head = f"{prefix}|window={window}|"  # the scope goes last: a tool's name may hold any character
    if quota.per == "contract":
        return [(f"{head}contract={name}", None, None)]
    if quota.per == "principal":
        return [(f"{head}principal={canonical(principal).decode()}", None, None)]
    declared = [s.name for s in contract.mcp.servers]
    if quota.per == "server":
        names = [quota.server] if quota.server else declared
        return [(f"{head}server={s}", s, None) for s in names if s in declared]
    assert quota.tool is not None  # the model requires it for per = "tool"
    parts = split_namespaced(quota.tool)
    if parts is None or parts[0] not in declared:
        return []
    return [(f"{head}tool={quota.tool}", parts[0], quota.tool)]


def _worst_calls(contract: Contract, server: str | None, tool: str | None) -> int:
    calls = contract.budget.max_tool_calls
    if server is None:
        return calls
    settings = next((s for s in contract.mcp.servers if s.name == server), None)
    if settings is None:
        return 0
    if settings.budget_calls is not None:
        calls = min(calls, settings.budget_calls)
    if tool is not None:
        parts = split_namespaced(tool)
        own = next((t for t in settings.tools if parts is not None and t.name == parts[1]), None)
        if own is not None and own.budget_calls is not None:
            calls = min(calls, own.budget_calls)
    return calls


def _entries(contract: Contract, principal: Any) -> list[tuple[Charge, Limit]]:
    out: list[tuple[Charge, Limit]] = []
    for owner, quota in quotas_of(contract):
        window = duration_ms(quota.window)
        label = quota_label(quota, owner=owner)
        for key, server, tool in _scope(owner, contract, quota, principal):
            tokens = contract.budget.max_tokens
            unbounded = ("tokens",) if quota.tokens is not None and tokens is None else ()
            amount = Amounts(1, _worst_calls(contract, server, tool), (tokens or 0) if server is None else 0)
            out.append((
                Charge(key, label, window, amount, unbounded),
                Limit(key, label, window, quota.runs, quota.tool_calls, quota.tokens),
            ))  # fmt: skip
    return out


def charges_for(contract: Contract, principal: Any) -> list[Charge]:
    """The counters a run of ``contract`` for ``principal`` counts against, with its worst case on each.

    A run counts one run on every counter; its tool calls are its ``max_tool_calls`` (lowered by
    the server's and the tool's ``budget_calls`` for a server or tool counter); its tokens are its
    ``max_tokens`` (a token quota over a run without ``max_tokens`` cannot be reserved: it is
    refused as unbounded). Two quotas on the same counter (same owner, scope and window) share it.
    """
    merged: dict[str, Charge] = {}
    for charge, _ in _entries(contract, principal):
        merged.setdefault(charge.key, charge)
    return list(merged.values())


def limits_for(contract: Contract, principal: Any) -> dict[str, Limit]:
    """The limits of the counters ``charges_for`` names; two quotas on one counter: the lower of each."""
    out: dict[str, Limit] = {}
    for _, limit in _entries(contract, principal):
        known = out.get(limit.key)
        if known is None:
            out[limit.key] = limit
            continue
        lower = {d: min((v for v in (known.get(d), limit.get(d)) if v is not None), default=None) for d in DIMENSIONS}
        out[limit.key] = Limit(limit.key, known.quota, limit.window_ms, lower["runs"], lower["tool_calls"],
                               lower["tokens"])  # fmt: skip
    return out


def used_by(entries: Iterable[Any], keys: Iterable[str]) -> dict[str, Amounts]:
    """What one run's session spent on each counter it reserved (``keys``): its settlement.

    ``entries`` are the session's entries (anything with ``kind`` and ``body``). A call counts
    once it was sent (``mcp_tool_intent``; a denied call never reached a server and counts
    nothing, as in the run's own budget); tokens are the ``model_turn`` usage the provider
    reported, which may pass ``max_tokens`` by the last turn (settlement records what was spent).
    """
    tally = UsageTally()
    for entry in entries:
        tally.add(entry)
    return tally.used(keys)


class UsageTally:
    """``used_by`` folded entry by entry (a run's journal feeds it): the calls sent per tool, the tokens."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.tokens = 0

    def add(self, entry: Any) -> None:
        body = entry.body
        if entry.kind == "mcp_tool_intent" and isinstance(body.get("tool"), str):
            self.calls[body["tool"]] = self.calls.get(body["tool"], 0) + 1
        elif entry.kind == "model_turn":
            usage = as_dict(body.get("usage")) or {}
            for name in ("input_tokens", "output_tokens"):
                value = usage.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    self.tokens += value

    def used(self, keys: Iterable[str]) -> dict[str, Amounts]:
        out: dict[str, Amounts] = {}
        for key in keys:
            server, tool = key_scope(key)
            if tool is not None:
                n = self.calls.get(tool, 0)
            elif server is not None:
                n = sum(k for c, k in self.calls.items() if (split_namespaced(c) or ("", ""))[0] == server)
            else:
                n = sum(self.calls.values())
            out[key] = Amounts(1, n, self.tokens if server is None else 0)
        return out


def key_scope(key: str) -> tuple[str | None, str | None]:
    """The (server, tool) whose calls a counter key counts (both None: every call of the run)."""
    server = tool = None
    for part in key.split("|", 2)[2:]:
        name, _, value = part.partition("=")
        if name == "server":
            server = value
        elif name == "tool":
            tool = value
            parts = split_namespaced(value)
            server = parts[0] if parts else None
    return server, tool
