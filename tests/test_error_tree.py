"""The exception tree drawn in ``truss/_errors.py``'s docstring is the real one: every ``TrussError``
is drawn, under its real base class, with its real exit code where the drawing names one.

The drawing had ``InDoubtError`` under ``RuntimeFailure`` (exit 4) while it is a ``RunSuspended``
(exit 3); docs/architecture.md and the CLI's one handler point readers at this drawing.
"""

from __future__ import annotations

import inspect
import re

import truss._errors as errors

DRAWN = re.compile(r"^    ([│├└─ ]*)([A-Z]\w+)\s+(?:exit (\d))?")
REAL = {n: c for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.TrussError)}


def problems(doc: str) -> list[str]:
    """What the drawing in ``doc`` gets wrong about the real classes (empty when it is true)."""
    found: list[str] = []
    drawn: set[str] = set()
    stack: list[str] = []
    for line in doc.splitlines():
        hit = DRAWN.match(line)
        if hit is None:
            continue
        depth, name = len(hit.group(1)) // 4, hit.group(2)
        stack = [*stack[:depth], name]
        drawn.add(name)
        cls = REAL.get(name)
        if cls is None:
            found.append(f"{name} is drawn but is no TrussError")
            continue
        base = cls.__mro__[1].__name__
        if not depth and cls is not errors.TrussError:
            found.append(f"{name} is drawn as a root but is a {base}")
        elif depth and base != stack[depth - 1]:
            found.append(f"{name} is drawn under {stack[depth - 1]} but is a {base}")
        if hit.group(3) and cls.exit_code != int(hit.group(3)):
            found.append(f"{name} is drawn with exit {hit.group(3)} but exits {cls.exit_code}")
    found += [f"{name} is not drawn" for name in sorted(set(REAL) - drawn)]
    return found


def test_every_error_is_drawn_under_its_real_base_with_its_real_exit_code() -> None:
    assert problems(errors.__doc__ or "") == []


def test_the_check_finds_a_class_drawn_under_the_wrong_base() -> None:
    # The drawing as it was: InDoubtError last under RuntimeFailure.
    doc = (errors.__doc__ or "").replace("    │   └── InDoubtError                an intent", "", 1)
    doc = doc.replace(
        "    │   └── ReplayDivergenceError ",
        "    │   ├── ReplayDivergenceError ",
    ).replace("did not record\n", "did not record\n    │   └── InDoubtError                x\n", 1)
    assert problems(doc) == ["InDoubtError is drawn under RuntimeFailure but is a RunSuspended"]


def test_the_check_finds_a_class_drawn_outside_the_tree() -> None:
    # The drawing as it was: QuotaExceededError at the left margin, below the tree's last branch.
    doc = (errors.__doc__ or "").replace("    └── QuotaExceededError    ", "    QuotaExceededError        ", 1)
    assert problems(doc) == ["QuotaExceededError is drawn as a root but is a TrussError"]
