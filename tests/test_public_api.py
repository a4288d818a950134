"""The public API is a decision: ``__all__`` of truss, truss.ledger and truss.mcp, compared to a snapshot.

Adding or removing a public name means editing the snapshot below in the same change, so the
decision is visible in review. Every name in ``__all__`` must resolve, and every public name a
package's namespace holds must be listed (or made private).
"""

from __future__ import annotations

import importlib
import types

import pytest

SNAPSHOT: dict[str, list[str]] = {
    "truss": [
        "BundleFormatError",
        "Clock",
        "Contract",
        "ContractError",
        "InDoubtError",
        "InputError",
        "KeyFileError",
        "McpError",
        "NotFoundError",
        "PinMismatchError",
        "ProviderError",
        "ReplayDivergenceError",
        "RunSuspended",
        "RuntimeFailure",
        "ServerStartError",
        "StoreBusyError",
        "StoreConflictError",
        "StoreError",
        "SystemClock",
        "ToolCallError",
        "ToolNotAdvertisedError",
        "TrussError",
        "UsageError",
        "VerificationError",
        "__version__",
        "contract_hash",
        "load_contract",
        "narrow_budget",
        "render_arguments",
        "render_intent",
    ],
    "truss.ledger": ["CanonicalError", "canonical", "sha256_ref", "value_ref"],
    "truss.mcp": ["Mounts", "ServerStatus", "ToolStatus", "connect"],
}


@pytest.mark.parametrize("package", sorted(SNAPSHOT))
def test_all_matches_the_snapshot(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(SNAPSHOT[package]), (
        f"{package}.__all__ changed; if that is intended, update SNAPSHOT in tests/test_public_api.py"
    )


@pytest.mark.parametrize("package", sorted(SNAPSHOT))
def test_every_name_in_all_resolves(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing


@pytest.mark.parametrize("package", sorted(SNAPSHOT))
def test_all_has_no_duplicates(package: str) -> None:
    module = importlib.import_module(package)
    assert len(set(module.__all__)) == len(module.__all__)


@pytest.mark.parametrize("package", sorted(SNAPSHOT))
def test_every_public_name_in_the_package_namespace_is_listed(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # submodules appear once imported
        # Truss's own classes and functions; typing helpers and `annotations` are not API.
        and str(getattr(value, "__module__", "")).split(".")[0] == "truss"
    }
    assert public <= set(module.__all__), sorted(public - set(module.__all__))


def test_every_error_class_is_exported_from_the_top_level() -> None:
    import truss
    from truss import _errors

    assert set(_errors.__all__) <= set(truss.__all__)
