"""The public API is a decision: ``__all__`` of each public package, compared to a snapshot.

Adding or removing a public name means editing the snapshot below in the same change, so the
decision is visible in review. Every name in ``__all__`` must resolve, and every public name a
package's namespace holds must be listed (or made private).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types

import pytest

SNAPSHOT: dict[str, list[str]] = {
    "truss": [
        # the verbs of a run, the one object they take, and what they return
        "Runtime",
        "run_contract",
        "resume_session",
        "replay_session",
        "approve_call",
        "resolve_call",
        "deliver_signal",
        "RunOutcome",
        "ReplayReport",
        "Contract",
        "load_contract",
        "Clock",
        "SystemClock",
        # the protocols a user implements
        "LedgerStore",
        "Provider",
        "ToolTransport",
        # the error tree
        "BundleFormatError",
        "ContractError",
        "InDoubtError",
        "InputError",
        "KeyFileError",
        "LoginRequiredError",
        "McpError",
        "NotFoundError",
        "PinMismatchError",
        "PolicyError",
        "ProviderError",
        "QuotaExceededError",
        "ReplayDivergenceError",
        "RunSuspended",
        "RuntimeFailure",
        "SandboxError",
        "ServerStartError",
        "SessionBusyError",
        "StoreBusyError",
        "StoreConflictError",
        "StoreError",
        "ToolCallError",
        "ToolNotAdvertisedError",
        "TrussError",
        "UsageError",
        "VerificationError",
        "WitnessError",
        "__version__",
    ],
    "truss.ledger": [
        # verify: one form, a report with raise_for_failure()
        "verify",
        "verify_since",
        "VerifyReport",
        "BundleReport",
        "SinceReport",
        # keys and trust
        "IdentityKey",
        "TrustedKeys",
        "VerifierKey",
        # the store and what it holds
        "open_store",
        "LedgerStore",
        "SessionInfo",
        "StoredCheckpoint",
        "Record",
        "StoredEntry",
        # the evidence a run leaves
        "export_bundle",
        "open_checkpoint",
        "Checkpoint",
        "open_verdict",
        "VerdictStatement",
        # the one canonical encoder
        "canonical",
        "CanonicalError",
    ],
    "truss.ledger.stores": [
        "LedgerStore",
        "SessionInfo",
        "StoreOpener",
        "StoredCheckpoint",
        "open_store",
        "redact_url",
        "register_store",
        "store_scheme",
        "store_schemes",
        "unregister_store",
    ],
    "truss.mcp": ["Mounts", "ServerStatus", "ToolStatus", "connect"],
    "truss.testing": [
        "FakeCall",
        "FakeTransport",
        "ManualClock",
        "MemoryStore",
        "check_ledger_store",
        "mounted_tool",
        "mounted_tools",
        "text_result",
    ],
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


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_importing_the_ledger_package_loads_neither_pynacl_nor_sqlite3() -> None:
    # `truss --help` and sans-IO callers import truss.ledger; the heavy modules wait for a name.
    heavy = ("nacl", "sqlite3", "truss.ledger.keys", "truss.ledger.stores.sqlite")
    assert _loaded_after("import truss.ledger, truss.ledger.stores", heavy) == []


def test_importing_truss_loads_no_run_machinery() -> None:
    # The CLI imports truss (for its errors) before every command, `truss --help` included.
    heavy = ("nacl", "sqlite3", "pydantic", "anyio", "truss.session", "truss.runtime", "truss.ledger.stores")
    assert _loaded_after("import truss", heavy) == []


def test_a_lazily_exported_name_is_the_object_its_module_defines() -> None:
    import truss
    import truss.ledger
    from truss import durable, runtime, session
    from truss.ledger import audit, bundle, keys, stores, verification

    assert truss.ledger.verify is audit.verify
    assert truss.ledger.BundleReport is bundle.BundleReport
    assert truss.ledger.TrustedKeys is keys.TrustedKeys
    assert truss.ledger.open_store is stores.open_store
    assert truss.ledger.VerifyReport is verification.VerifyReport
    assert truss.Runtime is runtime.Runtime
    assert truss.run_contract is session.run_contract
    assert truss.replay_session is durable.replay_session


def test_an_unknown_name_is_an_attribute_error() -> None:
    import truss
    import truss.ledger

    with pytest.raises(AttributeError):
        getattr(truss.ledger, "no_such_name")  # noqa: B009 - the lookup under test
    with pytest.raises(AttributeError):
        getattr(truss, "no_such_name")  # noqa: B009
