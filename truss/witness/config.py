"""The operator's witness settings: ``$TRUSS_HOME/witness.toml``.

A separate file rather than a table of ``config.toml``: the operator config is layered into every
effective contract and hashed with it, while witnessing is a property of the log, not of a run
(changing witnesses must not change contract hashes). Keys (unknown ones are refused)::

    policy = "witnesses.policy"   # a C2SP tlog-policy file (relative to the home): witnesses with
                                  # their cosignature keys and submission URLs, groups, the quorum
    min_interval = "1m"           # at a session end, submit at most this often (throttle)
    timeout = "5s"                # one HTTP request to one witness
    retries = 2                   # extra attempts after a transient failure (refused, timeout, 429, 5xx)
    at_session_end = true         # submit when a session ends (false: only `truss ledger checkpoint --witness`)

What it does not do: talk to witnesses (``client``, ``submit``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from truss._clock import parse_duration_ms
from truss._errors import PolicyError
from truss.ledger.tlog_policy import MAX_POLICY_BYTES, Policy, parse_policy

__all__ = ["CONFIG_NAME", "WitnessSettings", "load_settings", "read_policy_file"]

CONFIG_NAME = "witness.toml"
_MAX_CONFIG_BYTES = 64 * 1024


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    min_interval: str = "1m"
    timeout: str = "5s"
    retries: int = Field(default=2, ge=0, le=10)
    at_session_end: bool = True

    @field_validator("min_interval", "timeout")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration_ms(value)
        return value


@dataclass(frozen=True)
class WitnessSettings:
    """The settings in force: the policy, the throttle (ms), the request timeout (s), retries."""

    policy: Policy
    min_interval_ms: int
    timeout_s: float
    retries: int
    at_session_end: bool
    source: str


def read_policy_file(path: Path) -> Policy:
    """Parse the tlog-policy file at ``path``; ``PolicyError`` when it is missing or invalid."""
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_BYTES:
            raise PolicyError(f"the policy is {size} bytes, over {MAX_POLICY_BYTES}", file=str(path))
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(
            f"cannot read the policy file: {exc.strerror or exc}", remedy="check the path", file=str(path)
        ) from None
    return parse_policy(data, file=str(path))


def load_settings(home: Path) -> WitnessSettings | None:
    """The home's witness settings, or ``None`` when it has no ``witness.toml``."""
    path = home / CONFIG_NAME
    if not path.exists():
        return None
    file = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read the witness config: {exc.strerror or exc}", file=file) from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise PolicyError(f"the witness config is over {_MAX_CONFIG_BYTES} bytes", file=file)
    try:
        data: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"the witness config is not valid TOML: {exc}", file=file) from None
    try:
        config = _Config.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise PolicyError(
            f"{where or 'the witness config'}: {first.get('msg')}",
            remedy="the keys are policy, min_interval, timeout, retries, at_session_end (docs/witness.md)",
            file=file,
        ) from None
    policy_path = Path(config.policy)
    if not policy_path.is_absolute():
        policy_path = home / policy_path
    return WitnessSettings(
        policy=read_policy_file(policy_path),
        min_interval_ms=parse_duration_ms(config.min_interval),
        timeout_s=parse_duration_ms(config.timeout) / 1000,
        retries=config.retries,
        at_session_end=config.at_session_end,
        source=file,
    )
