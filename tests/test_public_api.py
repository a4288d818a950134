"""The public API is a decision: ``__all__`` of truss, truss.ledger and truss.mcp, compared to a snapshot.

Adding or removing a public name means editing the snapshot below in the same change, so the
decision is visible in review. Every name in ``__all__`` must resolve, and every public name a
package's namespace holds must be listed (or made private).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
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
        "PolicyError",
        "ProviderError",
        "ReplayDivergenceError",
        "RunSuspended",
        "RuntimeFailure",
        "SandboxError",
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
        "WitnessError",
        "__version__",
        "contract_hash",
        "load_contract",
        "narrow_budget",
        "render_arguments",
        "render_intent",
    ],
    "truss.ledger": [
        "BundleReport",
        "BundleSource",
        "CanonicalError",
        "Checkpoint",
        "Envelope",
        "Finding",
        "IdentityKey",
        "KINDS",
        "LedgerStore",
        "Note",
        "PAYLOAD_TYPE",
        "REASONS",
        "Record",
        "SessionInfo",
        "SinceReport",
        "SqliteStore",
        "StoredCheckpoint",
        "StoredEntry",
        "TlogProof",
        "TrustedKeys",
        "VERDICT_PREDICATE_TYPE",
        "VerdictStatement",
        "VerifierKey",
        "VerifyReport",
        "ZERO_HASH",
        "canonical",
        "check_bundle",
        "check_entries",
        "entry_bytes",
        "export_bundle",
        "format_tlog_proof",
        "key_id_of",
        "leaf_hash",
        "open_checkpoint",
        "open_note",
        "open_store",
        "open_verdict",
        "parse_checkpoint",
        "parse_envelope",
        "parse_note",
        "parse_tlog_proof",
        "sha256_ref",
        "sign_verdict",
        "value_ref",
        "verdict_statement",
        "verify_bundle",
        "verify_consistency",
        "verify_entries",
        "verify_envelope",
        "verify_inclusion",
        "verify_ledger",
        "verify_since",
    ],
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


def test_importing_the_ledger_package_loads_neither_pynacl_nor_sqlite3() -> None:
    # `truss --help` and sans-IO callers import truss.ledger; the heavy modules wait for a name.
    code = (
        "import sys, truss.ledger\n"
        "print(sorted(m for m in ('nacl', 'sqlite3', 'truss.ledger.keys', 'truss.ledger.store') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_a_lazily_exported_ledger_name_is_the_object_its_module_defines() -> None:
    import truss.ledger
    from truss.ledger import bundle, keys, store, verify

    assert truss.ledger.verify_bundle is bundle.verify_bundle
    assert truss.ledger.TrustedKeys is keys.TrustedKeys
    assert truss.ledger.SqliteStore is store.SqliteStore
    assert truss.ledger.VerifyReport is verify.VerifyReport


def test_an_unknown_ledger_name_is_an_attribute_error() -> None:
    import truss.ledger

    with pytest.raises(AttributeError):
        _ = truss.ledger.no_such_name  # pyright: ignore[reportAttributeAccessIssue]
