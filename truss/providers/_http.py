"""The one HTTP path of the model providers: POST a JSON body, get a bounded JSON answer, retry.

``JsonPoster.post`` sends one request over ``httpx2`` and retries it, with exponential backoff and
jitter, on 408/409/429/5xx answers and on transport failures (refused connection, reset,
timeout), honouring ``Retry-After`` (seconds or an HTTP date) and ``retry-after-ms`` up to a cap.
After ``max_attempts`` attempts, or at once for any other failure, it raises ``ProviderError``
with ``provider``, ``status``, ``attempts``, ``reason`` and ``retryable``.

Responses are untrusted: the body is read up to ``max_response_bytes`` (decoded bytes, so a
compressed bomb is cut off too), must be JSON, and any text taken from an error body is
shortened, stripped of control characters and of every secret the poster was given. Redirects are
not followed: a header carrying a key must never be replayed to another host.

Waiting between attempts goes through an injected ``sleep`` and jitter through an injected
``jitter`` so tests run without real waits. This module does not know either wire format; the
providers build the bodies and validate the answers.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import httpx2

from truss._clock import Clock
from truss._credentials import display_url
from truss._errors import ProviderError
from truss.ledger.canonical import CanonicalError, canonical

__all__ = [
    "MAX_TOOL_CALLS_PER_TURN",
    "HttpSettings",
    "JsonPoster",
    "Sleep",
    "as_list",
    "as_object",
    "retry_after_s",
    "token_count",
    "tool_call_count",
]

Sleep = Callable[[float], Awaitable[None]]

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_DETAIL_CHARS = 300
# A \uD800-\uDFFF escape in the body: only then can a parsed string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class HttpSettings:
    """Bounds of one provider's HTTP use. Units are in the names."""

    request_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_attempts: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 60.0
    max_response_bytes: int = 8 * 1024 * 1024


def retry_after_s(headers: Mapping[str, str], now_ms: int) -> float | None:
    """Seconds the server asked us to wait, or None when it did not say (or said nonsense).

    ``retry-after-ms`` (sent by both Anthropic and OpenAI) wins over ``Retry-After``, which is
    either delta-seconds or an HTTP date (RFC 9110 10.2.3). A date in the past means "now".
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        value = _finite_non_negative(millis)
        if value is not None:
            return value / 1000.0
    text = headers.get("retry-after")
    if text is None:
        return None
    value = _finite_non_negative(text)
    if value is not None:
        return value
    try:
        when = email.utils.parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; a zone-less parse means the zone was "-0000" or absent.
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now_ms / 1000.0)


def _finite_non_negative(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def as_object(value: Any) -> dict[str, Any] | None:
    """``value`` as a JSON object with string keys, or None (shape checks of untrusted answers)."""
    if isinstance(value, dict):
        return cast("dict[str, Any]", value)
    return None


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate (``"\\ud800"`` parses, but is not Unicode text and has no
    RFC 8785 form, so the turn could not be recorded) replaced by U+FFFD; pairs were joined by
    the parser already."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        items = cast("dict[str, Any]", value).items()
        return {_LONE_SURROGATE.sub("\ufffd", k): _without_lone_surrogates(v) for k, v in items}
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in cast("list[Any]", value)]
    return value


def as_arguments(value: Any) -> dict[str, Any] | None:
    """``value`` as a tool call's arguments, or None when it is not an object the ledger can record.

    A model's arguments are recorded (RFC 8785) before anything else happens, and JSON parsers
    accept what RFC 8785 has no form for: NaN, Infinity, integers beyond 2**53, nesting past the
    encoder's depth. Such arguments become a call whose arguments did not parse (the gate denies
    it and tells the model), never an exception that ends the run.
    """
    found = as_object(value)
    if found is None:
        return None
    try:
        canonical(found)
    except (CanonicalError, RecursionError):
        return None
    return found


def as_list(value: Any) -> list[Any] | None:
    """``value`` as a JSON array, or None."""
    if isinstance(value, list):
        return cast("list[Any]", value)
    return None


MAX_TOKEN_COUNT = 2**32
"""The largest usage figure a provider may report for one turn (four billion tokens, far past any
context window). A larger one is a bad answer: summed over turns and recorded, it would pass the
2**53 the ledger's canonical JSON can hold and end the run with an internal error. A turn's few
counts added together (Anthropic's input and cache counts) stay far below 2**53 under this bound."""


MAX_TOOL_CALLS_PER_TURN = 512
"""The most tool calls one answer may ask for (real models ask for a few, rarely dozens). A larger
answer is a bad answer: each call goes through the gate and leaves committed ledger entries, denied
ones too, so an answer of 16,000 calls (1.6 MB of the 8 MiB bound) wrote for a minute (a call
past the deadline is a denial written too) and grew the ledger by two entries a call."""


def tool_call_count(count: int, poster: JsonPoster) -> None:
    """Refuse an answer asking for more than ``MAX_TOOL_CALLS_PER_TURN`` tool calls as a bad answer."""
    if count > MAX_TOOL_CALLS_PER_TURN:
        raise poster.invalid(f"it asks for {count} tool calls, more than the {MAX_TOOL_CALLS_PER_TURN} one turn may")


def token_count(value: Any, what: str, poster: JsonPoster) -> int:
    """A usage figure: absent is 0; anything but an integer in ``0..MAX_TOKEN_COUNT`` is a bad answer."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise poster.invalid(f"{what} is not a non-negative integer")
    if value > MAX_TOKEN_COUNT:
        raise poster.invalid(f"{what} is larger than {MAX_TOKEN_COUNT}, more tokens than any turn can cost")
    return value


class _TooLarge(Exception):
    pass


@dataclass(frozen=True)
class _Failure:
    reason: str  # http_status | transport | timeout
    status: int | None
    detail: str
    retry_after: float | None = None


class JsonPoster:
    """POSTs JSON to one URL with retries. Holds the request headers (keys included) privately."""

    def __init__(
        self,
        *,
        provider: str,
        url: str,
        headers: Mapping[str, str],
        secrets: Sequence[str],
        settings: HttpSettings,
        clock: Clock,
        sleep: Sleep | None = None,
        jitter: Callable[[], float] | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self.url = url
        self.display_url = display_url(url)
        self.last_attempts = 0
        self.settings = settings
        self._headers = dict(headers)
        self._secrets = tuple(s for s in secrets if s)
        self._clock = clock
        self._sleep: Sleep = sleep or anyio.sleep
        self._jitter = jitter or random.random
        self._client = httpx2.AsyncClient(
            transport=transport,
            timeout=httpx2.Timeout(
                settings.request_timeout_s, connect=min(settings.connect_timeout_s, settings.request_timeout_s)
            ),
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"JsonPoster(provider={self.provider!r}, url={self.display_url!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def post(self, body: Mapping[str, Any]) -> Any:
        """The parsed JSON answer of a 2xx response; ``ProviderError`` otherwise."""
        try:
            payload = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            # The conversation holds a value JSON cannot carry (NaN, a non-JSON object): a caller's bug.
            raise self._error(
                f"the request cannot be encoded as JSON ({type(exc).__name__})", None, 0, "bad_request"
            ) from None
        attempts = 0
        while True:
            attempts += 1
            self.last_attempts = attempts
            failure = await self._attempt(payload, attempts)
            if isinstance(failure, _Failure):
                if attempts >= self.settings.max_attempts:
                    raise self._gave_up(failure, attempts)
                await self._sleep(self._delay_s(failure, attempts))
                continue
            return failure

    async def _attempt(self, payload: bytes, attempts: int) -> Any:
        try:
            with anyio.fail_after(self.settings.request_timeout_s):
                status, headers, raw = await self._exchange(payload)
        except TimeoutError:
            return _Failure("timeout", None, f"no complete answer within {self.settings.request_timeout_s:g}s")
        except httpx2.UnsupportedProtocol as exc:
            raise self._error(f"unsupported URL scheme ({type(exc).__name__})", None, attempts, "bad_url") from None
        except (httpx2.LocalProtocolError, UnicodeError) as exc:
            # Our own request is malformed (say, a key with a line break): sending it again cannot help.
            raise self._error(
                f"the request could not be sent ({type(exc).__name__})", None, attempts, "bad_request"
            ) from None
        except httpx2.TimeoutException as exc:
            return _Failure("timeout", None, type(exc).__name__)
        except httpx2.TransportError as exc:
            return _Failure("transport", None, type(exc).__name__)
        except httpx2.DecodingError as exc:
            raise self._error(
                f"the response body could not be decoded ({type(exc).__name__})", None, attempts, "bad_response"
            ) from None
        except (httpx2.HTTPError, httpx2.StreamError, httpx2.CookieConflict) as exc:
            # Anything else httpx2 raises (too many redirects, a stream misuse) is not worth repeating.
            raise self._error(f"the request failed ({type(exc).__name__})", None, attempts, "transport") from None
        except httpx2.InvalidURL:
            raise self._error("invalid URL", None, attempts, "bad_url") from None
        except _TooLarge:
            raise self._error(
                f"the response was larger than {self.settings.max_response_bytes} bytes",
                None,
                attempts,
                "response_too_large",
            ) from None
        if 200 <= status < 300:
            try:
                value = json.loads(raw)
                return _without_lone_surrogates(value) if _SURROGATE_ESCAPE.search(raw) else value
            except (ValueError, RecursionError):
                raise self._error(
                    f"HTTP {status} answer is not JSON ({len(raw)} bytes)", status, attempts, "bad_response"
                ) from None
        detail = self._detail(raw)
        if status in _RETRYABLE_STATUS or status >= 500:
            return _Failure("http_status", status, detail, retry_after_s(headers, self._clock.now_ms()))
        err = self._error(f"HTTP {status}: {detail}", status, attempts, "http_status")
        err.remedy = _remedy_for(status)
        raise err

    async def _exchange(self, payload: bytes) -> tuple[int, Mapping[str, str], bytes]:
        limit = self.settings.max_response_bytes
        headers = {"content-type": "application/json", "accept": "application/json", **self._headers}
        async with self._client.stream("POST", self.url, content=payload, headers=headers) as response:
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise _TooLarge
            buf = bytearray()
            async for chunk in response.aiter_bytes():
                buf += chunk
                if len(buf) > limit:
                    raise _TooLarge
            return response.status_code, response.headers, bytes(buf)

    def _delay_s(self, failure: _Failure, attempts: int) -> float:
        s = self.settings
        if failure.retry_after is not None:
            return min(failure.retry_after, s.max_retry_after_s)
        base = min(s.backoff_max_s, s.backoff_base_s * (2 ** (attempts - 1)))
        # Jitter down, never up, so the bound above holds and clients that failed together spread out.
        return base * (1.0 - 0.25 * self._jitter())

    def _detail(self, raw: bytes) -> str:
        """A short, clean excerpt of an error body: ``error.message`` when it is JSON, else the text."""
        text = raw[:4096].decode("utf-8", errors="replace")
        try:
            data: Any = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        body = as_object(data)
        if body is not None:
            error = body.get("error")
            error_object = as_object(error)
            if error_object is not None:
                message = error_object.get("message")
                kind = error_object.get("type")
                if isinstance(message, str):
                    text = f"{kind}: {message}" if isinstance(kind, str) else message
            elif isinstance(error, str):
                text = error
        return self._clean(text) or "(empty body)"

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        text = "".join(ch if ch.isprintable() else " " for ch in text)
        text = " ".join(text.split())
        if len(text) > _DETAIL_CHARS:
            text = text[: _DETAIL_CHARS - 1] + "…"
        return text

    def _gave_up(self, failure: _Failure, attempts: int) -> ProviderError:
        last = f"HTTP {failure.status}: {failure.detail}" if failure.status is not None else failure.detail
        err = self._error(
            f"gave up after {attempts} attempts; the last failed with {last}", failure.status, attempts, failure.reason
        )
        err.retryable = True
        err.remedy = (
            "The provider is overloaded, rate-limiting or unreachable; resume the run later"
            " or raise agent.max_attempts / agent.request_timeout"
        )
        return err

    def invalid(self, what: str) -> ProviderError:
        """The error for a 2xx answer whose JSON does not have the shape of the wire format."""
        err = self._error(f"the answer is not a valid response: {what}", 200, self.last_attempts, "bad_response")
        err.remedy = "Check that agent.base_url points at a server speaking this provider's API"
        return err

    def _error(self, what: str, status: int | None, attempts: int, reason: str) -> ProviderError:
        return ProviderError(
            f"model provider {self.provider} at {self.display_url}: {what}",
            provider=self.provider,
            status=status,
            attempts=attempts,
            reason=reason,
            url=self.display_url,
        )


def _remedy_for(status: int) -> str:
    if status in (401, 403):
        return "Check the API key named by agent.api_key_env and that it may use this model"
    if status == 404:
        return "Check agent.model and agent.base_url"
    if 300 <= status < 400:
        return "Redirects are not followed; set agent.base_url to the final address"
    return "Check agent.model, agent.base_url and the provider's documentation for this error"
