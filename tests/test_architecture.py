"""Imports point inward (DESIGN section 1). Reads every module's imports with ``ast``, lazy ones too.

A rule may have an allowlist entry only with the reason written beside it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "truss").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository, e.g. "truss/ledger/entry.py"
    module: str  # the imported module, absolute, e.g. "truss._clock"
    names: tuple[str, ...]  # for `from module import a, b`
    line: int
    top_level: bool  # at module level (runs on import), not inside a function


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "cli":
        parts[0] = "truss_cli"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT).as_posix()
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in tree.body:  # imports under a module-level `if`/`try` run on import too
        if isinstance(node, ast.If | ast.Try):
            top.update(id(n) for n in ast.walk(node))
    in_functions = {  # a call under a module-level statement runs on import; one in a function does not
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for inner in ast.walk(node)
    }
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(rel, a.name, (), node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append(Import(rel, base, tuple(a.name for a in node.names), node.lineno, id(node) in top))
        elif _imports_by_name(node):  # importlib.import_module("nacl._sodium") is an import too
            assert isinstance(node, ast.Call) and isinstance(node.args[0], ast.Constant)
            found.append(Import(rel, str(node.args[0].value), (), node.lineno, id(node) not in in_functions))
    return found


def _imports_by_name(node: ast.AST) -> bool:
    """A call ``importlib.import_module("literal")`` (or ``import_module("literal")``)."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "import_module" and isinstance(node.args[0].value, str)


ALL = [imp for path in SOURCES for imp in _imports(path)]


def _hits(prefixes: tuple[str, ...]) -> list[Import]:
    return [i for i in ALL if any(i.module == p or i.module.startswith(p + ".") for p in prefixes)]


def _show(bad: list[Import]) -> str:
    return "\n".join(f"{i.file}:{i.line} imports {i.module}" for i in bad)


def test_the_sources_were_found() -> None:
    files = {i.file for i in ALL}
    assert "truss/contract/loading.py" in files and "cli/main.py" in files


def test_only_truss_mcp_imports_the_mcp_sdk() -> None:
    bad = [i for i in _hits(("mcp", "mcp_types")) if not i.file.startswith("truss/mcp/")]
    assert not bad, _show(bad)


def test_the_cli_imports_the_mcp_tier_only_lazily() -> None:
    # `truss --help` and the ledger and contract commands must not pay for loading the SDK.
    bad = [i for i in _hits(("truss.mcp", "mcp", "mcp_types")) if i.file.startswith("cli/") and i.top_level]
    assert not bad, _show(bad)


def test_the_core_never_imports_the_mcp_tier() -> None:
    # gate, loop, session, verdict, policy, budget, contract, providers and the ledger take the
    # MCP tier as a parameter (a connector); only the CLI and truss/mcp itself import it.
    bad = [i for i in _hits(("truss.mcp",)) if i.file.startswith("truss/") and not i.file.startswith("truss/mcp/")]
    assert not bad, _show(bad)


# The stores package is the ledger's I/O edge (sqlite3 and, later, a PostgreSQL driver live there);
# `truss/ledger/store.py` is the compatibility re-export of the SQLite store for code written before it.
_STORE_FILES = ("truss/ledger/stores/", "truss/ledger/store.py")


def _ledger_core(imp: Import) -> bool:
    return imp.file.startswith("truss/ledger/") and not imp.file.startswith(_STORE_FILES)


def test_the_ledger_core_does_no_io_and_reads_no_clock() -> None:
    banned = ("anyio", "asyncio", "sqlite3", "time", "httpx2", "socket", "subprocess", "mcp", "truss.mcp")
    bad = [i for i in _hits(banned) if _ledger_core(i)]
    bad += [i for i in ALL if _ledger_core(i) and i.module == "truss._clock" and "SystemClock" in i.names]
    bad += [i for i in ALL if _ledger_core(i) and i.module == "truss" and "SystemClock" in i.names]
    assert not bad, _show(bad)


_RUN_LAYER = ("truss.runtime", "truss.session", "truss.durable", "truss.gate", "truss.loop", "truss.providers")


def test_the_ledger_never_imports_the_run_layer_or_the_contract() -> None:
    # The ledger (core and stores) is what an auditor installs and reads; it knows entries, not runs.
    bad = [
        i
        for i in _hits((*_RUN_LAYER, "truss.contract", "truss.policy", "truss.verdict"))
        if i.file.startswith("truss/ledger/")
    ]
    assert not bad, _show(bad)


def test_the_runtime_loads_the_store_and_key_modules_only_when_it_opens_them() -> None:
    # `import truss` (the CLI's first import) must not load sqlite3 or PyNaCl through the Runtime.
    heavy = ("truss.ledger.keys", "truss.ledger.stores", "truss.ledger.stores.sqlite", "sqlite3", "nacl")
    bad = [i for i in _hits(heavy) if i.file == "truss/runtime.py" and i.top_level]
    bad = [i for i in bad if not _under_type_checking(ROOT / i.file, i.line)]
    assert not bad, _show(bad)


def _under_type_checking(path: Path, line: int) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    return any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in blocks)


# Other SQLite files that are not a ledger, and why they may use sqlite3 directly:
SQLITE_OUTSIDE_THE_STORES = {
    "truss/witness/state.py": "the witness server's own state (the last checkpoint it cosigned per log), not a ledger",
}


def test_only_the_stores_package_imports_sqlite3() -> None:
    bad = [
        i
        for i in _hits(("sqlite3",))
        if i.file.startswith(("truss/", "cli/"))
        and not i.file.startswith(_STORE_FILES)
        and i.file not in SQLITE_OUTSIDE_THE_STORES
    ]
    assert not bad, _show(bad)


# A concrete backend is chosen by the URL scheme in `truss.ledger.stores.open_store`; everything
# else is typed to the `LedgerStore` protocol. Why each exception exists:
BACKEND_NAMING_ALLOWED = {
    "truss/ledger/store.py": "the compatibility re-export of the SQLite store (code written before the stores package)",
    "truss/testing/__init__.py": "re-exports the in-memory store as a fake for tests of code built on a store",
}
_BACKENDS = ("truss.ledger.stores.sqlite", "truss.ledger.stores.memory", "truss.ledger.stores._sqlite_writer")
_BACKEND_NAMES = ("SqliteStore", "MemoryStore", "open_sqlite", "open_memory", "SqliteWriter")


def _names_a_backend(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    found = [f"{rel}:{i.line} imports {i.module}" for i in _imports(path) if i.module in _BACKENDS]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in _BACKEND_NAMES:
            found.append(f"{rel}:{getattr(node, 'lineno', 0)} names {name}")
    return found


def test_nothing_outside_the_stores_package_names_a_concrete_store() -> None:
    outside = [p for p in SOURCES if not p.relative_to(ROOT).as_posix().startswith("truss/ledger/stores/")]
    bad = [
        hit
        for p in outside
        if p.relative_to(ROOT).as_posix() not in BACKEND_NAMING_ALLOWED
        for hit in _names_a_backend(p)
    ]
    assert not bad, "\n".join(bad)


def test_the_backend_rule_sees_a_named_backend() -> None:
    assert _names_a_backend(ROOT / "truss" / "ledger" / "store.py"), "the reader must see the re-export's names"


def test_nothing_in_truss_or_the_cli_imports_the_compatibility_store_module() -> None:
    bad = [i for i in _hits(("truss.ledger.store",)) if i.file.startswith(("truss/", "cli/"))]
    assert not bad, _show(bad)


def test_only_the_key_module_imports_pynacl() -> None:
    # truss/_sigchild.py is the verified read's signature helper process (truss/_sigcheck.py): it
    # runs alone under `python -I`, imports nothing of Truss, and calls the same libsodium function.
    allowed = ("truss/ledger/keys.py", "truss/_sigchild.py")
    bad = [i for i in _hits(("nacl",)) if i.file not in allowed]
    assert not bad, _show(bad)


def test_only_the_key_module_reaches_cryptography_and_only_lazily() -> None:
    # ML-DSA-44 is optional: importing Truss must work with a `cryptography` that lacks it. The
    # OAuth token store's AES-GCM file (in every `cryptography`) is the one other lazy user.
    allowed = ("truss/ledger/keys.py", "truss/mcp/oauth/store.py")
    bad = [i for i in _hits(("cryptography",)) if i.file not in allowed or i.top_level]
    assert not bad, _show(bad)


# Why each exception exists:
TRUSS_CLI_ALLOWED = {
    "truss/__main__.py": "`python -m truss` is the CLI's second entry point; it only calls truss_cli.main",
}


def test_the_library_never_imports_the_cli() -> None:
    bad = [i for i in _hits(("truss_cli",)) if i.file.startswith("truss/") and i.file not in TRUSS_CLI_ALLOWED]
    assert not bad, _show(bad)


def test_only_the_clock_module_imports_time_uuid_or_secrets() -> None:
    bad = [i for i in _hits(("time", "uuid", "secrets")) if i.file != "truss/_clock.py"]
    assert not bad, _show(bad)


PURE = [
    "truss/policy.py",
    "truss/budget.py",
    "truss/verdict.py",
    "truss/elicitation.py",
    "truss/contract/",
    "truss/_regex.py",
    "truss/_conninfo.py",
    "truss/_credentials.py",
    "truss/_pointer.py",
    "truss/_registry.py",
    "truss/_sandbox_profile.py",
]


@pytest.mark.parametrize("module", PURE)
def test_pure_decision_modules_do_no_io(module: str) -> None:
    # A name ending in '/' is a package: every module in it.
    files = {i.file for i in ALL if i.file == module or (module.endswith("/") and i.file.startswith(module))}
    assert files, f"no module {module}"
    banned = ("anyio", "asyncio", "sqlite3", "httpx2", "socket", "subprocess", "truss.ledger.store", "truss.mcp")
    banned += ("truss.ledger.stores", "truss.runtime", "truss.session")
    bad = [i for i in _hits(banned) if i.file in files]
    assert not bad, _show(bad)


def test_the_rules_see_lazy_imports_inside_functions() -> None:
    probe = ROOT / "cli" / "main.py"
    lazy = [i for i in _imports(probe) if not i.top_level]
    assert lazy, "cli/main.py imports pkgutil inside a function; the reader must see it"
