"""Where spans go and how: the operator's ``[telemetry]`` table over the standard ``OTEL_*`` variables.

``resolve_settings(config, environ)`` gives the ``TelemetrySettings`` of a process, or None when
telemetry is off. It is on when an endpoint is known: ``[telemetry] traces_endpoint`` or
``otlp_endpoint`` in the operator config, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``. It is off, whatever else is set, with ``[telemetry] enabled =
false``, ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``.

**The operator config wins**, key by key: a key set in ``[telemetry]`` is used as written and its
``OTEL_*`` variable is not read; a key left out falls back to the variable, then to the default
(docs/telemetry.md has the table). Headers merge by name, the config's winning. Argument and
result content is exported only with ``record_arguments`` / ``record_results`` in the config: no
environment variable turns it on (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is not read).

Bad values are one-paragraph errors naming the key or variable, never its value (a header variable
holds credentials). Configured telemetry without the ``otel`` extra is a ``UsageError`` naming
``pip install 'truss[otel]'``: the check looks for the package without importing it. No I/O
beyond that look-up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

from truss._errors import ContractError, UsageError
from truss.contract.fields import duration_ms
from truss.contract.telemetry import Telemetry, check_endpoint_url
from truss.telemetry.spans import AttrValue, Content

__all__ = ["ENV_NAMES", "EXTRA", "Protocol", "TelemetrySettings", "require_extra", "resolve_settings"]

EXTRA = "pip install 'truss[otel]'"
"""What installs the OpenTelemetry extra (named in the error when it is missing)."""

Protocol = Literal["http/protobuf", "http/json"]

_DEFAULTS = {
    "timeout_ms": 10_000,
    "max_queue_spans": 2048,
    "max_batch_spans": 512,
    "schedule_delay_ms": 5000,
    "shutdown_timeout_ms": 5000,
    "max_attribute_chars": 8192,
}


@dataclass(frozen=True)
class TelemetrySettings:
    """Resolved telemetry settings. ``headers`` may hold secret values: never printed (``repr`` hides them)."""

    traces_url: str
    protocol: Protocol = "http/protobuf"
    headers: Mapping[str, str] = field(default_factory=dict[str, str], repr=False)
    timeout_s: float = 10.0
    compression: Literal["gzip", "none"] = "none"
    resource: Mapping[str, AttrValue] = field(default_factory=dict[str, AttrValue])
    content: Content = field(default_factory=Content)
    max_queue_spans: int = 2048
    max_batch_spans: int = 512
    schedule_delay_s: float = 5.0
    shutdown_timeout_s: float = 5.0
    source: str = "config"  # where the endpoint came from: "config" or the variable's name

    @property
    def secret_values(self) -> frozenset[str]:
        """Header values to keep out of every span and message (all of them: a header may carry a credential)."""
        return frozenset(v for v in self.headers.values() if len(v) >= 4)

    def describe(self) -> str:
        """Where spans go, for messages (no header is ever shown)."""
        return f"OTLP {self.protocol} to {self.traces_url}"


def resolve_settings(
    config: Telemetry | None, environ: Mapping[str, str], *, check_extra: bool = True
) -> TelemetrySettings | None:
    """The telemetry settings of a process with this operator ``config`` and ``environ`` (see the module docstring)."""
    if config is not None and not config.enabled:
        return None
    if _flag(environ, "OTEL_SDK_DISABLED"):
        return None
    conf = config or Telemetry()
    url, source = _traces_url(conf, environ)
    if url is None:
        return None
    exporters = [x.strip().lower() for x in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if x.strip()]
    if exporters == ["none"]:
        return None
    if exporters and "otlp" not in exporters:
        raise UsageError(
            f"OTEL_TRACES_EXPORTER names {', '.join(exporters)}; Truss exports spans only over OTLP",
            remedy="Set OTEL_TRACES_EXPORTER=otlp (or unset it), or turn telemetry off with OTEL_TRACES_EXPORTER=none",
            env="OTEL_TRACES_EXPORTER",
        )
    timeout_ms = _ms(conf.timeout, environ, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"))
    delay_ms = _ms(conf.schedule_delay, environ, ("OTEL_BSP_SCHEDULE_DELAY",))
    limit_names = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
    content = Content(
        arguments=conf.record_arguments,
        results=conf.record_results,
        max_chars=conf.max_attribute_chars or _int_env(environ, limit_names) or _DEFAULTS["max_attribute_chars"],
    )
    settings = TelemetrySettings(
        traces_url=url,
        protocol=_protocol(conf, environ),
        headers=_headers(conf, environ),
        timeout_s=(timeout_ms or _DEFAULTS["timeout_ms"]) / 1000,
        compression=_compression(conf, environ),
        resource=_resource(conf, environ),
        content=content,
        max_queue_spans=conf.max_queue_spans
        or _int_env(environ, ("OTEL_BSP_MAX_QUEUE_SIZE",))
        or _DEFAULTS["max_queue_spans"],
        max_batch_spans=conf.max_batch_spans
        or _int_env(environ, ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",))
        or _DEFAULTS["max_batch_spans"],
        schedule_delay_s=(delay_ms or _DEFAULTS["schedule_delay_ms"]) / 1000,
        shutdown_timeout_s=(
            duration_ms(conf.shutdown_timeout) if conf.shutdown_timeout else _DEFAULTS["shutdown_timeout_ms"]
        )
        / 1000,
        source=source,
    )
    if check_extra:
        require_extra(settings)
    return settings


def require_extra(settings: TelemetrySettings) -> None:
    """``UsageError`` naming the install command when the ``otel`` extra is not installed."""
    if not _installed("opentelemetry.proto"):
        where = "[telemetry] in the operator config" if settings.source == "config" else settings.source
        raise UsageError(
            f"telemetry is configured ({where} sends spans to {settings.traces_url}), but the OpenTelemetry "
            "extra is not installed",
            remedy=f"Install it with {EXTRA}, or turn telemetry off ([telemetry] enabled = false, or "
            "OTEL_SDK_DISABLED=true)",
            extra="otel",
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- one setting each -------------------------------------------------------------------------------


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() == "true"


def _traces_url(conf: Telemetry, environ: Mapping[str, str]) -> tuple[str | None, str]:
    if conf.traces_endpoint:
        return conf.traces_endpoint, "config"
    if conf.otlp_endpoint:
        return _append_path(conf.otlp_endpoint), "config"
    for name, signal in (("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", True), ("OTEL_EXPORTER_OTLP_ENDPOINT", False)):
        value = environ.get(name, "").strip()
        if value:
            try:
                check_endpoint_url(value, what=name)
            except ValueError as exc:
                raise UsageError(str(exc), remedy=f"Fix {name} in the environment", env=name) from None
            return (value if signal else _append_path(value)), name
    return None, ""


def _append_path(base: str) -> str:
    # The OTLP rule for the base endpoint: the signal's path is appended to it.
    return base.rstrip("/") + "/v1/traces"


def _protocol(conf: Telemetry, environ: Mapping[str, str]) -> Protocol:
    if conf.protocol is not None:
        return conf.protocol
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(name, "").strip()
        if not value:
            continue
        if value in ("http/protobuf", "http/json"):
            return value
        raise UsageError(
            f"{name} is {value!r}; Truss sends OTLP over HTTP only (http/protobuf or http/json)",
            remedy=f"Set {name}=http/protobuf and point the endpoint at the collector's HTTP port (4318)",
            env=name,
        )
    return "http/protobuf"


def _compression(conf: Telemetry, environ: Mapping[str, str]) -> Literal["gzip", "none"]:
    if conf.compression is not None:
        return conf.compression
    for name in ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"):
        value = environ.get(name, "").strip().lower()
        if not value:
            continue
        if value in ("gzip", "none"):
            return "gzip" if value == "gzip" else "none"
        raise UsageError(f"{name} is {value!r}; use gzip or none", remedy=f"Fix {name}", env=name)
    return "none"


def _headers(conf: Telemetry, environ: Mapping[str, str]) -> dict[str, str]:
    merged: dict[str, tuple[str, str]] = {}  # lower-case name -> (name, value)
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for key, value in _parse_pairs(environ.get(name, ""), name).items():
            merged[key.lower()] = (key, value)
    for key, header in conf.headers.items():
        if isinstance(header, str):
            value = header
        else:
            secret = environ.get(header.secret_env)
            if not secret:
                raise ContractError(
                    f"[telemetry] header {key!r} takes its value from {header.secret_env}, which is not set",
                    remedy=f"Set {header.secret_env} in the environment that runs Truss, or remove the header",
                    path=f"telemetry.headers.{key}",
                    env=header.secret_env,
                )
            value = header.format.replace("{}", secret)
        merged[key.lower()] = (key, value)
    return dict(merged.values())


def _parse_pairs(text: str, variable: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (values percent-encoded), the format of the ``OTEL_*_HEADERS`` and resource variables."""
    out: dict[str, str] = {}
    for i, item in enumerate(p for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        key, value = key.strip(), unquote(value.strip())
        if not sep or not key or any(ch in key + value for ch in "\r\n\0"):
            raise UsageError(
                f"{variable} entry {i + 1} is not key=value",  # never the value: it may be a credential
                remedy=f"Write {variable} as key1=value1,key2=value2 (values percent-encoded)",
                env=variable,
            )
        out[key] = value
    return out


def _ms(value: str | None, environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    """A duration from the config, else whole milliseconds from the first variable set."""
    if value is not None:
        return duration_ms(value)
    return _int_env(environ, names)


def _int_env(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        text = environ.get(name, "").strip()
        if not text:
            continue
        if not text.isdigit() or int(text) <= 0:
            raise UsageError(f"{name} is {text!r}, not a positive whole number", remedy=f"Fix {name}", env=name)
        return int(text)
    return None


def _resource(conf: Telemetry, environ: Mapping[str, str]) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    env_pairs = _parse_pairs(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES")
    out.update(env_pairs)
    out.update(conf.resource)
    service = conf.service_name or environ.get("OTEL_SERVICE_NAME", "").strip() or env_pairs.get("service.name")
    out["service.name"] = service or "truss"
    out.setdefault("service.version", _version())
    return out


def _version() -> str:
    import truss

    return truss.__version__


ENV_NAMES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
)
"""Every environment variable this module reads (docs/telemetry.md lists them; a test compares)."""
