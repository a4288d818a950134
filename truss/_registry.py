"""Named registries for extension points: a name maps to one entry, and an unknown name is refused.

Providers and done-check kinds are chosen by name from a contract; store schemes by the scheme of
a URL. Each is a ``Registry``: entries carry their own ``name``, a name is registered once (a
second registration is a mistake unless it says ``replace=True``), and a lookup of a name that is
not registered gives ``None`` (``get``) or raises ``LookupError`` (``require``) with the names
that are registered and the closest one, never a fallback. ``copy()`` gives an independent
registry (a program or a test may extend its own without touching the default one), and
``registered(entry)`` adds an entry for the length of a ``with`` block.

This module does no I/O and imports nothing of Truss's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

__all__ = ["NAME_RE", "Named", "Registry"]

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}\Z")
"""What a registered name looks like: lower-case letters, digits, ``_`` and ``-``, starting with a letter."""


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """Entries by name. ``what`` names the kind of entry in messages ("provider", "done-check kind")."""

    def __init__(self, what: str, entries: Iterable[T] = ()) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        for entry in entries:
            self.register(entry)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, names={list(self.names())!r})"

    def register(self, entry: T, *, replace: bool = False) -> None:
        """Add ``entry`` under ``entry.name``; a name already taken raises ``ValueError`` unless ``replace``."""
        name = entry.name
        if not NAME_RE.match(name):
            raise ValueError(f"{self.what} name {name!r} must be 1-64 of [a-z0-9_-], starting with a letter")
        if name in self._entries and not replace:
            raise ValueError(f"a {self.what} named {name!r} is already registered")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove ``name``; removing a name that is not registered raises ``LookupError``."""
        self.require(name)
        del self._entries[name]

    @contextmanager
    def registered(self, entry: T) -> Generator[T]:
        """``entry`` is registered inside the block and removed after it (the block may not replace it)."""
        self.register(entry)
        try:
            yield entry
        finally:
            if self._entries.get(entry.name) is entry:
                del self._entries[entry.name]

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def require(self, name: str) -> T:
        """The entry named ``name``, or ``LookupError`` with the message of ``unknown``."""
        entry = self._entries.get(name)
        if entry is None:
            raise LookupError(self.unknown(name))
        return entry

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter([self._entries[name] for name in self.names()])

    def __len__(self) -> int:
        return len(self._entries)

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries."""
        return Registry(self.what, self)

    def unknown(self, name: str) -> str:
        """The sentence for a name that is not registered: the closest registered name and all of them."""
        shown = name if len(name) <= 64 else name[:61] + "..."
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(repr(n) for n in self.names()) or "none"
        return f"no {self.what} named {shown!r} is registered{hint}; registered: {known}"
