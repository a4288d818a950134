"""One witness over HTTP: submit a signed checkpoint with ``add-checkpoint`` and read its answer.

``WitnessClient.submit`` sends ``old N``, the consistency proof from N to the checkpoint's size,
and the signed note, to ``<witness url>/add-checkpoint``, and returns a ``WitnessOutcome``; it
never raises for what a witness does. Answers (``truss.ledger.witness.interpret``):

- 200: the returned lines are verified against the witness's key from the policy (lines by
  other keys are ignored); at least one valid cosignature means ``cosigned``.
- 409: the witness's latest size S. S at most the checkpoint's size: prove again from S (at most
  three times); S the checkpoint's size once proven from it: ``refused`` (``inconsistent``), the
  spec's answer to the same size with another root than the one it cosigned. S above the
  checkpoint's size but within the log: ``superseded`` (it already cosigned a later checkpoint).
  S beyond the log: ``refused`` (``witness_ahead``: this log was truncated, or someone else signs
  for its origin).
- 404, 403, 400, 422: ``refused`` (``unknown_log``, ``forbidden``, ``bad_request``,
  ``inconsistent``). 422 means the witness holds a checkpoint this one does not extend.
- refused connections, timeouts, 408, 429 and 5xx: retried up to ``retries`` more times with a
  bounded backoff (``Retry-After`` honoured up to a cap), then ``unreachable``.

Each request is bounded by ``timeout_s``; answers are read up to 64 KiB. Redirects are not
followed. https witnesses are reached with certificate verification; plain http ones (loopback,
the inside of a bastion) skip loading the CA store, which they never use. Waiting goes through
an injected ``sleep``, so tests run without real waits. What it does not do: choose witnesses
or record outcomes (``submit``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx2

from truss._errors import BundleFormatError, TrussError, VerificationError
from truss.ledger.cosignature import verify_cosignatures
from truss.ledger.note import Checkpoint, NoteSignature, parse_note
from truss.ledger.tlog_policy import PolicyWitness
from truss.ledger.witness import (
    MAX_RESPONSE_BYTES,
    AddCheckpoint,
    Outcome,
    format_add_checkpoint,
    interpret,
)

__all__ = ["Prover", "Sleep", "WitnessClient", "WitnessOutcome"]

Sleep = Callable[[float], Awaitable[None]]
Prover = Callable[[int], Awaitable[Sequence[bytes]]]
"""``prove(old_size)``: the consistency proof from ``old_size`` to the checkpoint's size."""

OutcomeWord = Literal["cosigned", "refused", "unreachable", "superseded"]
_MAX_REPROOFS = 3
_BACKOFF_BASE_S = 0.25
_BACKOFF_MAX_S = 2.0
_REASONS = {404: "unknown_log", 403: "forbidden", 400: "bad_request", 422: "inconsistent"}


@dataclass(frozen=True)
class WitnessOutcome:
    """What one witness did with one checkpoint.

    ``outcome``: ``cosigned``, ``refused``, ``unreachable`` or ``superseded``; ``reason`` a stable
    code; ``detail`` Truss's own words (never text from the witness); ``witness_size`` the size
    a 409 named; ``cosignatures`` the verified lines.
    """

    witness: str
    size: int
    outcome: OutcomeWord
    reason: str
    detail: str = ""
    status: int | None = None
    witness_size: int | None = None
    attempts: int = 0
    cosignatures: tuple[NoteSignature, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "witness": self.witness,
            "size": self.size,
            "outcome": self.outcome,
            "reason": self.reason,
            "attempts": self.attempts,
        }
        if self.detail:
            out["detail"] = self.detail
        if self.status is not None:
            out["status"] = self.status
        if self.witness_size is not None:
            out["witness_size"] = self.witness_size
        if self.cosignatures:
            out["cosignatures"] = [line.line().rstrip("\n") for line in self.cosignatures]
        return out


class WitnessClient:
    """Submits checkpoints to witnesses; one ``httpx2.AsyncClient`` shared by all of them."""

    def __init__(
        self,
        *,
        timeout_s: float,
        retries: int,
        sleep: Sleep | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self._sleep: Sleep = sleep or anyio.sleep
        self._transport = transport
        self._clients: dict[bool, httpx2.AsyncClient] = {}

    def _client(self, url: str) -> httpx2.AsyncClient:
        # Loading the CA store costs ~100 ms; a plain-http witness (loopback, a bastion's inside)
        # never uses TLS, so its client skips it. Redirects are never followed, so an http URL
        # cannot turn into an unverified https one.
        tls = not url.lower().startswith("http://")
        client = self._clients.get(tls)
        if client is None:
            client = self._clients[tls] = httpx2.AsyncClient(
                transport=self._transport,
                timeout=httpx2.Timeout(self.timeout_s),
                follow_redirects=False,
                verify=tls,  # TLS, whenever it is used, is verified
            )
        return client

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def __aenter__(self) -> WitnessClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def submit(
        self,
        witness: PolicyWitness,
        note: bytes,
        checkpoint: Checkpoint,
        *,
        known_size: int,
        tree_size: int,
        prove: Prover,
    ) -> WitnessOutcome:
        """Submit ``note`` (the signed ``checkpoint``) to ``witness``, starting from ``known_size``."""
        name, size = witness.name, checkpoint.size
        if not witness.url:
            return WitnessOutcome(name, size, "refused", "no_url", "the policy gives this witness no URL")
        if known_size > size:
            detail = f"it already cosigned size {known_size}"
            return WitnessOutcome(name, size, "superseded", "superseded", detail, witness_size=known_size)
        url = witness.url.rstrip("/") + "/add-checkpoint"
        old, attempts = known_size, 0
        for _ in range(_MAX_REPROOFS + 1):
            try:
                proof: Sequence[bytes] = await prove(old) if old else ()
            except TrussError as exc:
                return WitnessOutcome(name, size, "refused", "cannot_prove", f"no proof from size {old}: {exc.message}")
            body = format_add_checkpoint(AddCheckpoint(old_size=old, proof=tuple(proof), checkpoint=note))
            answer, tries = await self._post(url, body)
            attempts += tries
            if isinstance(answer, str):
                return WitnessOutcome(name, size, "unreachable", "unreachable", answer, attempts=attempts)
            if answer.kind == "cosigned":
                return self._cosigned(witness, note, size, answer, attempts)
            if answer.kind == "conflict":
                assert answer.size is not None
                theirs = answer.size
                if theirs > tree_size:
                    return WitnessOutcome(
                        name,
                        size,
                        "refused",
                        "witness_ahead",
                        f"it cosigned size {theirs}, more than this log holds ({tree_size}): "
                        "the log was truncated, or another history of it was shown to the witness",
                        status=409,
                        witness_size=theirs,
                        attempts=attempts,
                    )
                if theirs > size:
                    return WitnessOutcome(
                        name,
                        size,
                        "superseded",
                        "superseded",
                        f"it already cosigned a later checkpoint (size {theirs})",
                        status=409,
                        witness_size=theirs,
                        attempts=attempts,
                    )
                if theirs == old == size:
                    # Proven from this very size and still 409: it cosigned another root here.
                    return WitnessOutcome(
                        name,
                        size,
                        "refused",
                        "inconsistent",
                        f"the witness cosigned another tree of size {size}: the log showed it another history",
                        status=409,
                        witness_size=theirs,
                        attempts=attempts,
                    )
                if theirs == old:
                    break
                old = theirs
                continue
            if answer.kind == "retry":
                return WitnessOutcome(
                    name, size, "unreachable", "unavailable", f"HTTP {answer.status} after retries", answer.status,
                    attempts=attempts,
                )  # fmt: skip
            reason = _REASONS.get(answer.status, "bad_response")
            detail = answer.detail or {
                "unknown_log": "the witness does not follow this log",
                "forbidden": "the witness does not trust the key that signed the checkpoint",
                "bad_request": "the witness refused the request as malformed",
                "inconsistent": f"the witness holds a checkpoint that this one (from size {old}) does not extend",
            }.get(reason, "")
            return WitnessOutcome(name, size, "refused", reason, detail, answer.status, attempts=attempts)
        return WitnessOutcome(
            name, size, "refused", "conflict_loop", "the witness kept answering 409", 409, attempts=attempts
        )

    def _cosigned(
        self, witness: PolicyWitness, note: bytes, size: int, answer: Outcome, attempts: int
    ) -> WitnessOutcome:
        name = witness.name
        try:
            parsed = parse_note(note)
            joined = parsed.to_bytes() + b"".join(line.line().encode() for line in answer.lines)
            valid = verify_cosignatures(joined, [witness.key])
        except VerificationError:
            return WitnessOutcome(
                name, size, "refused", "bad_cosignature", "its cosignature does not verify", 200, attempts=attempts
            )
        except BundleFormatError:
            return WitnessOutcome(
                name, size, "refused", "bad_response", "its answer is not a note signature", 200, attempts=attempts
            )
        if not valid:
            return WitnessOutcome(
                name, size, "refused", "bad_response", "no cosignature by its key in the answer", 200, attempts=attempts
            )
        lines = tuple(line for line in answer.lines if any(v.line == line.line() for v in valid))
        return WitnessOutcome(name, size, "cosigned", "cosigned", status=200, attempts=attempts, cosignatures=lines)

    async def _post(self, url: str, body: bytes) -> tuple[Outcome | str, int]:
        """The answer (or why there was none) and how many attempts it took."""
        failure = ""
        for attempt in range(1, self.retries + 2):
            retry_after: float | None = None
            try:
                with anyio.fail_after(self.timeout_s):
                    status, content_type, raw, retry_after = await self._exchange(url, body)
                answer = interpret(status, content_type, raw)
                if answer.kind != "retry":
                    return answer, attempt
                failure = f"HTTP {status}"
            except TimeoutError:
                failure = f"no answer within {self.timeout_s:g}s"
            except httpx2.TimeoutException:
                failure = f"no answer within {self.timeout_s:g}s"
            except _TooLarge:
                return Outcome("bad_response", 200, detail="the answer is larger than 64 KiB"), attempt
            except (httpx2.InvalidURL, httpx2.UnsupportedProtocol):
                return "the witness URL is not a usable http(s) URL", attempt
            except httpx2.TransportError as exc:
                failure = f"cannot reach it ({type(exc).__name__})"
            except httpx2.HTTPError as exc:
                return f"the request failed ({type(exc).__name__})", attempt
            if attempt <= self.retries:
                delay = min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** (attempt - 1))
                await self._sleep(min(_BACKOFF_MAX_S, retry_after) if retry_after is not None else delay)
        if failure.startswith("HTTP "):
            return Outcome("retry", int(failure.split()[1])), self.retries + 1
        return failure, self.retries + 1

    async def _exchange(self, url: str, body: bytes) -> tuple[int, str, bytes, float | None]:
        headers = {"content-type": "text/plain; charset=utf-8", "accept": "text/plain"}
        async with self._client(url).stream("POST", url, content=body, headers=headers) as response:
            buf = bytearray()
            async for chunk in response.aiter_bytes():
                buf += chunk
                if len(buf) > MAX_RESPONSE_BYTES:
                    raise _TooLarge
            retry_after = response.headers.get("retry-after")
            wait = float(retry_after) if retry_after is not None and retry_after.isdigit() else None
            return response.status_code, response.headers.get("content-type", ""), bytes(buf), wait


class _TooLarge(Exception):
    pass
