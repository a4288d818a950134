"""The value types of contract keys: names, globs, regexes, durations, pointers, and the model base.

Every model of the contract package derives from ``Model`` (unknown keys refused, frozen, strict
types) and types its keys with the annotated types here, so that a glob, a regex or a duration is
checked the same way wherever it appears. Durations stay strings (``"30s"``) so that the canonical
form and its hash are what the operator wrote; ``duration_ms()`` converts them. Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import warnings
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from truss._clock import parse_duration_ms
from truss._credentials import redact_url, url_credentials
from truss._pointer import pointer_problem

__all__ = [
    "CREDENTIAL_ENV_RE",
    "CREDENTIAL_HEADER_RE",
    "ENV_NAME_RE",
    "NAME_RE",
    "PIN_RE",
    "SERVER_NAME_RE",
    "TOOL_REF_RE",
    "BaseUrl",
    "Duration",
    "EnvName",
    "Glob",
    "KeyValueError",
    "Model",
    "NonNegativeInt",
    "Pointer",
    "PositiveInt",
    "Regex",
    "check_env_name",
    "check_tool_ref",
    "duration_ms",
    "toml_type",
]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\Z")
SERVER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
PIN_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
TOOL_REF_RE = re.compile(r"^mcp:[a-z0-9][a-z0-9_-]{0,31}:.+\Z")
CREDENTIAL_ENV_RE = re.compile(
    r"(?i)token|secret|passw(?:or)?d|_pwd\Z|api_?key|access_?key|private_?key|credential|cookie"
)
"""Environment names whose literal values would be credentials (refused in ``env``: use ``secret_env``)."""
CREDENTIAL_HEADER_RE = re.compile(r"(?i)^(?:proxy-)?authorization\Z|^cookie\Z|token|secret|api-?key|password")
"""Header names whose literal values would be credentials (refused: use ``{ secret_env = ... }``).
Credentials in URLs and command lines follow the one rule of ``truss._credentials``."""


def _check_duration(value: str) -> str:
    parse_duration_ms(value)
    return value


def _check_regex(value: str) -> str:
    with warnings.catch_warnings():
        # Python warns (FutureWarning) about patterns whose meaning will change, such as '[a--z]'
        # or a nested set; refusing them keeps a rule meaning the same on every Python version.
        warnings.simplefilter("error")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from exc
        except Warning as exc:
            raise ValueError(f"ambiguous regular expression {value!r}: {exc}; escape the character") from exc
    return value


def _check_glob(value: str) -> str:
    if not value:
        raise ValueError("a glob may not be empty")
    # fnmatch accepts nearly anything; refuse unbalanced character classes, which it would
    # silently treat as literals and so match something other than what the operator meant.
    depth = 0
    for ch in value:
        if ch == "[":
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
    if depth:
        raise ValueError(f"invalid glob {value!r}: '[' without a closing ']'")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            re.compile(fnmatch.translate(value))
        except (re.error, Warning) as exc:
            raise ValueError(f"invalid glob {value!r}: {exc}") from exc
    return value


def check_env_name(value: str) -> str:
    if not ENV_NAME_RE.match(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, '_')")
    return value


def check_tool_ref(value: str) -> str:
    if not TOOL_REF_RE.match(value):
        raise ValueError(f"tool {value!r} must be a namespaced name 'mcp:<server>:<tool>'")
    return value


def _check_pointer(value: str) -> str:
    problem = pointer_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


_HTTP_URL_RE = re.compile(r"^https?://[^\s]+\Z")


def _check_base_url(value: str) -> str:
    # A model provider's address is recorded in the effective contract like a server's URL, and
    # shown in its errors: the same credential rule (truss._credentials) keeps a key out of both.
    if not _HTTP_URL_RE.match(value):
        raise ValueError(f"base_url {redact_url(value)!r} must be an http:// or https:// URL")
    found = url_credentials(value)
    if found:
        raise KeyValueError(
            f"base_url holds a credential ({'; '.join(found)}); the contract is recorded, so a key may not "
            "be written in a model provider's address",
            remedy='Take it out of base_url, name the variable holding the key in api_key_env = "VARIABLE", '
            "and set it in Truss's environment (docs/providers.md)",
        )
    return value


Duration = Annotated[str, AfterValidator(_check_duration)]
Regex = Annotated[str, AfterValidator(_check_regex)]
Glob = Annotated[str, AfterValidator(_check_glob)]
EnvName = Annotated[str, AfterValidator(check_env_name)]
Pointer = Annotated[str, AfterValidator(_check_pointer)]
BaseUrl = Annotated[str, AfterValidator(_check_base_url)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


@functools.lru_cache(maxsize=1024)
def duration_ms(value: str) -> int:
    """Milliseconds of a validated duration string (remembered: the run's deadline is read several
    times per model turn and per call, always the same few strings)."""
    return parse_duration_ms(value)


class KeyValueError(ValueError):
    """A validator's refusal that knows its remedy (the loader shows it instead of a generic one).

    ``at``: the key path of the offending value below the validated table (a model validator of a
    server that refuses one of its tool entries says ``("tools", 2)``), so the error names the
    file and line that wrote that value, which may be another layer than the table's."""

    def __init__(self, message: str, *, remedy: str, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.remedy = remedy
        self.at = at


class Model(BaseModel):
    """The base of every contract model: unknown keys refused, values frozen, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


def toml_type(value: Any) -> str:
    """The TOML word for the type of ``value`` ("a string", "an array"), for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__
