"""The operator's ``[telemetry]`` table: where a run's OpenTelemetry spans go (docs/telemetry.md).

``[telemetry]`` lives only in the operator config (``$TRUSS_HOME/config.toml``). It is not part of
the effective contract: it is neither hashed nor recorded, so turning telemetry on or pointing it
at another collector never changes a contract's hash, and a resumed run exports to wherever the
operator's config says now, not where it said when the run started. A contract, an agent file or
an overlay that holds ``[telemetry]`` is refused (``truss.contract.layers``).

Every key may be left out: an unset key is taken from the standard ``OTEL_*`` environment
variables, else from its default (``truss.telemetry.settings`` resolves them). Secrets follow the
servers' rule: a header whose name says it carries a credential must come from the environment
(``{ secret_env = "VAR", format = "Bearer {}" }``), and an endpoint URL may hold no credential
(``truss._credentials``: user info, a credential query parameter). Pure, but for
``load_telemetry_config`` reading the config file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from truss._credentials import url_credentials
from truss.contract.fields import CREDENTIAL_HEADER_RE, Duration, Model, PositiveInt
from truss.contract.layers import parse_layer, read_toml_file
from truss.contract.servers import SecretHeader
from truss.contract.validation import from_validation

__all__ = ["Telemetry", "TelemetryConfig", "check_endpoint_url", "load_telemetry_config", "telemetry_from_text"]

_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\Z")
_RESOURCE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}\Z")


def check_endpoint_url(value: str, *, what: str = "otlp_endpoint") -> str:
    """``value`` when it is an http(s) URL without credentials; the reason in a ``ValueError`` otherwise."""
    if not re.match(r"^https?://[^\s/?#]+[^\s]*\Z", value):
        raise ValueError(f"{what} must be an http:// or https:// URL (with a host)")  # no value: it may hold a secret
    found = url_credentials(value)
    if found:
        raise ValueError(
            f"{what} holds a credential ({'; '.join(found)}); send it as a header from the environment instead: "
            'headers = { Authorization = { secret_env = "VARIABLE", format = "Bearer {}" } }'
        )
    return value


class Telemetry(Model):
    """``[telemetry]``: every key optional (None: the ``OTEL_*`` variable or the default applies)."""

    enabled: bool = True
    otlp_endpoint: str | None = None
    traces_endpoint: str | None = None
    protocol: Literal["http/protobuf", "http/json"] | None = None
    headers: dict[str, str | SecretHeader] = Field(default_factory=dict[str, str | SecretHeader])
    timeout: Duration | None = None
    compression: Literal["gzip", "none"] | None = None
    service_name: str | None = Field(default=None, min_length=1, max_length=256)
    resource: dict[str, str | int | float | bool] = Field(default_factory=dict[str, str | int | float | bool])
    record_arguments: bool = False
    record_results: bool = False
    max_queue_spans: PositiveInt | None = None
    max_batch_spans: PositiveInt | None = None
    schedule_delay: Duration | None = None
    shutdown_timeout: Duration | None = None
    max_attribute_chars: Annotated[int, Field(ge=64, le=1_048_576)] | None = None

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return check_endpoint_url(value) if value is not None else None

    @field_validator("traces_endpoint")
    @classmethod
    def _traces_endpoint(cls, value: str | None) -> str | None:
        return check_endpoint_url(value, what="traces_endpoint") if value is not None else None

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str | SecretHeader]) -> dict[str, str | SecretHeader]:
        for name, header in value.items():
            if not _HEADER_NAME_RE.match(name):
                raise ValueError(f"header name {name!r} is not an HTTP header name")
            if isinstance(header, str):
                if any(ch in header for ch in "\r\n\0"):
                    raise ValueError(f"header {name!r} holds a line break or NUL")
                if header and CREDENTIAL_HEADER_RE.search(name):
                    raise ValueError(
                        f"header {name!r} holds a literal value and carries credentials; keep it out of the "
                        f'file: {name} = {{ secret_env = "VARIABLE", format = "Bearer {{}}" }}'
                    )
        return value

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        for key in value:
            if not _RESOURCE_KEY_RE.match(key):
                raise ValueError(f"resource attribute name {key!r} must be [A-Za-z_][A-Za-z0-9_.-]*")
        return value


class TelemetryConfig(Model):
    """The part of an operator config this module reads: its ``[telemetry]`` table, if any."""

    telemetry: Telemetry | None = None


def telemetry_from_text(text: str, *, file: str) -> Telemetry | None:
    """The ``[telemetry]`` table of an operator config's TOML text (None when it has none). No I/O.

    Only ``[telemetry]`` is validated here; the other tables are the contract loader's.
    """
    layer = parse_layer(text, file=file, role="operator config")
    table: Any = layer.data.get("telemetry")
    if table is None:
        return None
    data = {"telemetry": table}
    try:
        return TelemetryConfig.model_validate(data).telemetry
    except ValidationError as exc:
        raise from_validation(exc, [layer], data, root=TelemetryConfig) from None


def load_telemetry_config(home: Path | str) -> Telemetry | None:
    """The ``[telemetry]`` table of ``HOME/config.toml``; None when the file or the table is absent."""
    path = Path(home) / "config.toml"
    if not path.exists():
        return None
    return telemetry_from_text(read_toml_file(path, role="operator config"), file=str(path))
