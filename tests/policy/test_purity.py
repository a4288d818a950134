"""Policy and budget stay pure: their own imports are values-only modules, never I/O or clocks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import truss
from truss.policy import regex_profile

ALLOWED = {
    "__future__",
    "collections.abc",
    "dataclasses",
    "enum",
    "fnmatch",
    "functools",
    "math",
    "re",
    "types",
    "typing",
    "truss._regex",
    "truss.contract",
    "truss.tools",
}


@pytest.mark.parametrize("module", ["policy.py", "budget.py"])
def test_the_pure_decision_modules_import_no_io_and_no_clock(module: str) -> None:
    tree = ast.parse((Path(truss.__file__).parent / module).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            imported.add(node.module)
    assert imported <= ALLOWED, imported - ALLOWED


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, FutureWarning):
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="()[]{}*+?|\\^$a-,12:>=#<P", max_size=24).filter(_compiles))
def test_regex_profile_reads_any_valid_pattern_without_raising(pattern: str) -> None:
    profile = regex_profile(pattern)
    assert profile.quantifiers >= 0
    assert 1 <= profile.max_chars <= 65_536
