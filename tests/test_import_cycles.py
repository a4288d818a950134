"""No import cycle inside ``truss/`` or ``cli/``: modules form layers, read from their imports with ``ast``.

Every import counts, lazy ones inside functions and ``TYPE_CHECKING`` ones too (a lazy import
that dodges a cycle at run time is still a cycle in the design: ``contract`` <-> ``policy`` was
one). ``from package import name`` is an edge to ``package.name`` when that is a module, else to
``package``. Importing ``a.b.c`` also runs ``a/b/__init__.py``, so it is an edge to each package
above the target too, except the packages the importing module is itself inside (their
``__init__`` is already running) and the two roots, ``truss`` and ``truss_cli``: every module
runs its root's ``__init__`` first, and a root that re-exports the public API imports the world,
so that edge would make every module part of one cycle. An *explicit* ``import truss`` or
``from truss import X`` in a module still counts.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from tests.test_architecture import ALL, ROOT, SOURCES, Import

ROOTS = frozenset({"truss", "truss_cli"})


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "cli":
        parts[0] = "truss_cli"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {p.relative_to(ROOT).as_posix(): _module_of(p) for p in SOURCES}
KNOWN = frozenset(MODULES.values())


def _targets(imp: Import) -> set[str]:
    """The modules of ``truss``/``truss_cli`` that running this import runs."""
    source = MODULES[imp.file]
    named = [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in KNOWN]
    direct = set(named) or ({imp.module} if imp.module in KNOWN else set())
    out = set(direct)
    for target in direct:
        parts = target.split(".")
        for end in range(1, len(parts)):
            parent = ".".join(parts[:end])
            inside = source == parent or source.startswith(parent + ".")
            if parent in KNOWN and parent not in ROOTS and not inside:
                out.add(parent)
    out.discard(source)
    return out


def _graph(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """module -> {imported module: the first import statement that makes the edge}."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in KNOWN}
    for imp in imports:
        for target in sorted(_targets(imp)):
            graph[MODULES[imp.file]].setdefault(target, imp)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One cycle (as a closed path of modules) for each strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the graph has a few hundred nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_a_cycle_in(graph, set(c)) for c in components]


def _a_cycle_in(graph: dict[str, dict[str, Import]], component: set[str]) -> list[str]:
    start = min(component)
    paths: dict[str, list[str]] = {start: [start]}
    queue = [start]
    while queue:  # breadth first inside the component: the shortest way back to the start
        node = queue.pop(0)
        for succ in sorted(graph[node]):
            if succ == start:
                return [*paths[node], start]
            if succ in component and succ not in paths:
                paths[succ] = [*paths[node], succ]
                queue.append(succ)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def _describe(graph: dict[str, dict[str, Import]], cycle: list[str]) -> str:
    steps = [f"  {a} -> {b} ({graph[a][b].file}:{graph[a][b].line})" for a, b in itertools.pairwise(cycle)]
    return "import cycle:\n" + "\n".join(steps)


def test_no_module_of_truss_or_the_cli_is_part_of_an_import_cycle() -> None:
    graph = _graph(ALL)
    cycles = _cycles(graph)
    assert not cycles, "\n".join(_describe(graph, c) for c in cycles)


def _imp(file: str, module: str, *names: str, line: int = 1) -> Import:
    return Import(file, module, names, line, top_level=False)


def test_the_cycle_reader_sees_a_cycle_made_by_a_lazy_import_inside_a_function() -> None:
    # The shape of the old contract <-> policy cycle: policy imports contract at the top, contract
    # imports policy inside a validator.
    graph = _graph(
        [
            _imp("truss/contract/__init__.py", "truss.contract.models", "Contract"),
            _imp("truss/policy.py", "truss.contract", "Contract"),
            _imp("truss/contract/models.py", "truss.policy", "regex_profile", line=7),
        ]
    )
    cycles = _cycles(graph)
    assert cycles == [["truss.contract", "truss.contract.models", "truss.policy", "truss.contract"]]
    assert "truss/contract/models.py:7" in _describe(graph, cycles[0])


def test_the_cycle_reader_counts_the_package_init_a_submodule_import_runs() -> None:
    # Importing truss.providers.base runs truss/providers/__init__.py, which imports the contract.
    graph = _graph(
        [
            _imp("truss/contract/__init__.py", "truss.contract.loading", "load_contract"),
            _imp("truss/providers/__init__.py", "truss.contract", "Contract"),
            _imp("truss/contract/loading.py", "truss.providers.base", "Provider"),
        ]
    )
    assert _cycles(graph)


def test_the_cycle_reader_does_not_count_the_package_a_module_is_inside() -> None:
    graph = _graph([_imp("truss/contract/loading.py", "truss.contract.models", "Contract")])
    assert "truss.contract" not in graph["truss.contract.loading"]
    assert "truss.contract.models" in graph["truss.contract.loading"]
