""" "Did you mean": the closest of some known names to a name that is not among them. Pure, a leaf."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name that differs only in case, else difflib's closest match, else None."""
    names = list(known)
    folded = {n.lower(): n for n in names}
    if name.lower() in folded and folded[name.lower()] != name:
        return folded[name.lower()]
    match = difflib.get_close_matches(name, names, n=1)
    return match[0] if match else None


def did_you_mean(missing: Iterable[str], known: Iterable[str]) -> str:
    """``Did you mean 'x' for 'y'? `` for each missing name with a close known one, or ``""``."""
    names = list(known)
    hints = [f"{close!r} for {name!r}" for name in missing if (close := closest(name, names)) is not None]
    return f"Did you mean {', '.join(hints)}? " if hints else ""
