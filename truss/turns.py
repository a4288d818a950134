"""How a model turn's request is recorded: a delta that commits to the whole conversation by hash.

A turn's request is the whole conversation so far. Storing and hashing it whole at every turn
costs O(N²) bytes and work over N turns, so a ``model_turn`` entry's ``request`` is the ref of a
*delta* instead (canonical JSON, kept as a blob)::

    {"turn": n, "prev": <request ref of turn n-1, or null on turn 1>,
     "system": <text: on turn 1, later only when it changed>,
     "tools": <ref of the canonical tool list, a blob of its own>,
     "append": [<the messages added since turn n-1, notes included>]}

``prev`` is the hash of the previous delta, so each delta's hash pins its turn's whole request
transitively, and ``rebuild_request`` (or ``RequestFold``, turn by turn) folds the chain back into
the provider-neutral request the provider was sent. The ``replay_key`` is the same chain over the
notes-free messages (its ``prev`` is the previous turn's key), hashed but not stored.

This module is pure: it builds deltas and folds them; reading blobs is the caller's (a function
passed in). It does not redact: the loop hands it messages already in their recorded form.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from truss._errors import VerificationError
from truss.ledger.canonical import sha256_ref

__all__ = ["RequestFold", "delta", "rebuild_request"]

BlobReader = Callable[[str], bytes | None]


def delta(*, turn: int, prev: str | None, system: str | None, tools: str, append: list[Any]) -> dict[str, Any]:
    """One link of a request (or replay-key) chain; ``system`` None means "as on the turn before"."""
    out: dict[str, Any] = {"turn": turn, "prev": prev, "tools": tools, "append": append}
    if system is not None:
        out["system"] = system
    return out


def _bad(ref: str, why: str) -> VerificationError:
    return VerificationError(
        f"the recorded request {ref[:23]}... does not rebuild: {why}",
        remedy="Verify the ledger with 'truss ledger verify'",
        reason="bad_request_chain",
        ref=ref,
    )


def _load(ref: str, blob: BlobReader) -> dict[str, Any] | None:
    data = blob(ref)
    if data is None:
        return None
    if sha256_ref(data) != ref:
        raise _bad(ref, "its stored bytes do not hash to its ref")
    try:
        value: Any = json.loads(data)
    except ValueError:
        raise _bad(ref, "it is not JSON") from None
    if not isinstance(value, dict):
        raise _bad(ref, "it is not a JSON object")
    return cast(dict[str, Any], value)


class RequestFold:
    """Rebuilds the requests of one session's turns in order, each from its delta and the fold so far.

    ``add`` returns the full request of the turn whose delta it was given, or None once a payload
    on the chain is not held (erased): no later turn can be rebuilt then either.
    """

    def __init__(self, blob: BlobReader) -> None:
        self._blob = blob
        self._broken = False
        self.head: str | None = None
        self.turn = 0
        self.system = ""
        self.messages: list[Any] = []
        self._tools_ref: str | None = None
        self.tools: list[Any] = []

    def add(self, ref: str, link: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Fold the delta ``ref`` (``link``: its JSON, when the caller already loaded and hash-checked it)."""
        if self._broken:
            return None
        link = link if link is not None else _load(ref, self._blob)
        if link is None:
            self._broken = True
            return None
        turn, prev, tools, append = link.get("turn"), link.get("prev"), link.get("tools"), link.get("append")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn != self.turn + 1:
            raise _bad(ref, f"it is turn {turn!r} where turn {self.turn + 1} was expected")
        if prev != self.head:
            raise _bad(ref, "its prev is not the request of the turn before")
        if not isinstance(tools, str) or not isinstance(append, list):
            raise _bad(ref, "it needs a tools ref and an append list")
        system = link.get("system")
        if system is None and turn == 1:
            raise _bad(ref, "turn 1 names no system text")
        if system is not None and not isinstance(system, str):
            raise _bad(ref, "its system text is not a string")
        if tools != self._tools_ref:
            listed = self._blob(tools)
            if listed is None:
                self._broken = True
                return None
            if sha256_ref(listed) != tools:
                raise _bad(ref, "its tool list's stored bytes do not hash to their ref")
            try:
                offered: Any = json.loads(listed)
            except ValueError:
                offered = None
            if not isinstance(offered, list):
                raise _bad(ref, "its tool list is not a JSON array")
            self.tools, self._tools_ref = cast(list[Any], offered), tools
        if system is not None:
            self.system = system
        self.messages.extend(cast(list[Any], append))
        self.head, self.turn = ref, turn
        return {"system": self.system, "messages": list(self.messages), "tools": list(self.tools), "turn": turn}


def rebuild_request(ref: str, blob: BlobReader) -> dict[str, Any] | None:
    """The full provider-neutral request (``system``, ``messages``, ``tools``, ``turn``) that the
    delta ``ref`` pins, following ``prev`` back to turn 1; None when a payload on the way is not held.

    Raises ``VerificationError`` (``reason="bad_request_chain"``) when the chain does not hold together.
    """
    chain: list[tuple[str, dict[str, Any]]] = []
    cursor: Any = ref
    while cursor is not None:
        if not isinstance(cursor, str):
            raise _bad(ref, "a prev on its chain is not a ref")
        link = _load(cursor, blob)
        if link is None:
            return None
        turn = link.get("turn")
        if (
            not isinstance(turn, int)
            or isinstance(turn, bool)
            or turn < 1
            or (chain and turn != chain[-1][1]["turn"] - 1)
        ):
            raise _bad(cursor, "the turns on its chain are not consecutive from 1")
        chain.append((cursor, link))
        cursor = link.get("prev")
    fold = RequestFold(blob)
    request: dict[str, Any] | None = None
    for link_ref, link in reversed(chain):
        request = fold.add(link_ref, link)
        if request is None:
            return None
    return request
