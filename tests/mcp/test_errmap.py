"""Every exception class the SDK and its transports can raise maps to a Truss error, not the catch-all."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp
import mcp_types
import pytest

from truss._credentials import display_url
from truss._errors import ServerStartError, ToolCallError
from truss.mcp._errmap import classify, is_unmapped, to_call_error, to_start_error

# Server-side and command-line modules are not on the client's path (and mcp.cli exits on import
# without its optional dependencies).
_SKIP = ("mcp.server", "mcp.cli", "mcp.os.win32")


def _modules(package: Any) -> list[str]:
    root = Path(package.__path__[0])
    names: list[str] = []
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if any(name == s or name.startswith(s + ".") for s in _SKIP) or name.endswith("__main__"):
            continue
        names.append(name)
    return sorted(names)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in (mcp, mcp_types):
        for name in _modules(package):
            module = importlib.import_module(name)
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, Exception)
                    and value.__module__.startswith(("mcp", "mcp_types"))
                ):
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    for module in (httpx2, anyio):
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, Exception):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    for cls in (OSError, FileNotFoundError, PermissionError, ConnectionError, TimeoutError, UnicodeDecodeError):
        found[cls.__qualname__] = cls
    return [found[k] for k in sorted(found)]


def _instance(cls: type[BaseException]) -> BaseException:
    # Build each class the way its raisers do where the constructor needs more than a message.
    if issubclass(cls, mcp.MCPError):
        error = cls.__new__(cls)
        mcp.MCPError.__init__(error, code=-32603, message="x")
        return error
    if issubclass(cls, httpx2.HTTPStatusError):
        request = httpx2.Request("GET", "http://127.0.0.1/")
        return cls("x", request=request, response=httpx2.Response(500, request=request))
    try:
        return cls("x")
    except Exception:
        return cls.__new__(cls)


def test_the_scan_finds_the_sdk_exception_classes() -> None:
    names = {c.__qualname__ for c in _exception_classes()}
    assert {"MCPError", "InputRequiredRoundsExceededError", "StreamableHTTPError", "SubscriptionLost"} <= names
    assert {"ReadTimeout", "ConnectError", "BrokenResourceError"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_class_is_mapped(cls: type[BaseException]) -> None:
    exc = _instance(cls)
    assert not is_unmapped(exc), f"{cls.__module__}.{cls.__qualname__} falls through to the catch-all"
    error = to_call_error(exc, server="s", tool="t")
    assert isinstance(error, ToolCallError)
    assert (error.server, error.tool) == ("s", "t")


def test_timeout_and_closed_connection_are_retryable_server_errors_are_not() -> None:
    assert classify(mcp.MCPError(code=-32001, message="timed out"))[:2] == ("timeout", True)
    assert classify(mcp.MCPError(code=-32000, message="Connection closed"))[:2] == ("connection_closed", True)
    assert classify(mcp.MCPError(code=-32602, message="bad params"))[:2] == ("server_error", False)


def test_the_sdks_own_codes_are_server_errors_when_the_server_answered_with_them() -> None:
    for code in (-32000, -32001):
        cause, retryable, _, recorded = classify(mcp.MCPError(code=code, message="busy"), (code, "busy"))
        assert (cause, retryable, recorded) == ("server_error", False, code)


def test_nested_exception_groups_are_flattened_to_the_telling_leaf() -> None:
    inner = mcp.MCPError(code=-32000, message="Connection closed")
    group = ExceptionGroup("outer", [ExceptionGroup("inner", [RuntimeError("noise"), inner])])
    error = to_start_error(group, server="s")
    assert isinstance(error, ServerStartError)
    assert (error.cause, error.code) == ("connection_closed", -32000)


def test_safe_url_masks_user_info_by_the_one_rule_and_leaves_out_query_and_fragment() -> None:
    # The rule is truss._credentials' (tests/security/test_credentials_in_urls.py tries every attack);
    # a parameter no rule would call a credential may still hold one, so no parameter is shown.
    shown = display_url("https://user:pw@example.test:8443/mcp?region=eu&token=abc#access_token=xyz")
    assert shown == "https://***@example.test:8443/mcp"
    assert display_url("https://example.test/mcp?k=v") == "https://example.test/mcp"
    assert display_url("https://example.test/\x1b[31mmcp") == "https://example.test/?[31mmcp"
