"""The sandbox's layering, read from its imports (``ast``): pure cores, stdlib-only helper scripts."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "truss" / "mcp" / "sandbox"
PURE = [PACKAGE.parents[1] / "_sandbox_profile.py", PACKAGE / "_resolve.py", PACKAGE / "_argv.py"]
# Run by bwrap and the SDK as plain scripts (python -I -S): the standard library and nothing else.
SCRIPTS = ["_inner.py", "_launch.py"]
IO = {"os", "io", "socket", "subprocess", "shutil", "pathlib", "tempfile", "anyio", "asyncio", "selectors", "time"}


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", PURE, ids=[p.name for p in PURE])
def test_the_profile_resolution_and_plan_do_no_io_of_their_own(path: Path) -> None:
    bad = {m for m in _imported(path) if m.split(".")[0] in IO}
    assert not bad


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_helper_scripts_import_only_the_standard_library(name: str) -> None:
    outside = {m for m in _imported(PACKAGE / name) if m.split(".")[0] not in sys.stdlib_module_names}
    assert not outside
