"""What every command handler receives: resolved global options, the one way to open the ledger, output helpers."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from truss_cli._term import safe_human, safe_json_text

from truss._clock import Clock, SystemClock
from truss._errors import UsageError

if TYPE_CHECKING:  # the store and key modules load only when a command opens the ledger
    from truss.runtime import Connector, Runtime


@dataclass
class Ctx:
    """Global options, resolved once. ``home`` is ``--home``, else ``$TRUSS_HOME``, else ``./.truss``;
    ``db`` is ``--db``, else ``$TRUSS_DB``, else ``[harness] db`` of ``HOME/config.toml``, else
    ``HOME/ledger.db``.

    ``db`` is the ledger as given: a path, or a store URL (``sqlite:///PATH``, ``memory:``, a
    registered scheme); ``open_runtime`` is the one place a command turns it into a store.
    """

    home: Path
    db: str
    key: Path
    verbose: bool = False
    json: bool = False
    clock: Clock = field(default_factory=SystemClock)
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    @classmethod
    def from_options(cls, home: str | None, db: str | None, key: str | None, *, verbose: bool, json_out: bool) -> Ctx:
        home_path = Path(home or os.environ.get("TRUSS_HOME") or ".truss")
        chosen = db or os.environ.get("TRUSS_DB")
        if not chosen and (home_path / "config.toml").exists():  # no contract models loaded without one
            from truss.contract.harness_db import operator_db

            chosen = operator_db(home_path)
        return cls(
            home=home_path,
            db=chosen or str(home_path / "ledger.db"),
            key=Path(key) if key else home_path / "identity.key",
            verbose=verbose,
            json=json_out,
        )

    def open_runtime(
        self,
        *,
        signing: bool = True,
        create: bool = False,
        connector: Connector | None = None,
    ) -> Runtime:
        """The ledger of ``--db`` (typed as the store protocol) with, when ``signing``, the key of ``--key``.

        ``create`` lets a missing ledger be created (``init``, ``run``, ``serve-mcp`` and the
        durability commands); the reading commands refuse one instead. Close it (``with``).
        """
        from truss.runtime import Runtime

        return Runtime.open(
            home=self.home,
            db=self.db,
            key=self.key,
            signing=signing,
            create=create,
            clock=self.clock,
            environ=dict(os.environ),
            connector=connector,
        )

    @property
    def config_file(self) -> Path:
        return self.home / "config.toml"

    def definitions(self) -> Any:
        """The home's store of tool definitions by pin (``truss.pins.DefinitionStore``, ``HOME/pins``)."""
        from truss.pins import DefinitionStore

        return DefinitionStore(self.home / "pins")

    def emit(self, data: Any, human: str | None = None) -> None:
        """Print ``data`` as one JSON document with ``--json``, else the human text."""
        if self.json:
            self.out.write(safe_json_text(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False)) + "\n")
        elif human is not None:
            human = safe_human(human)  # untrusted text inside: no terminal control sequences
            self.out.write(human if human.endswith("\n") else human + "\n")
        self.out.flush()

    def progress(self, line: str) -> None:
        """One progress line on stderr (never stdout, which carries results)."""
        self.err.write(safe_human(line) + "\n")
        self.err.flush()


def table(rows: list[list[str]], header: list[str] | None = None) -> str:
    """Short, aligned columns for human output."""
    all_rows = ([header] if header else []) + rows
    if not all_rows:
        return ""
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in all_rows]
    return "\n".join(lines)


# How much of a listed session row the verified reader checked (``SessionInfo.verified``), as the
# human listings' VERIFIED column says it.
_VERIFIED = {"chain": "chain", "ends": "ends", None: "no"}
VERIFIED_NOTE = (
    "VERIFIED: ends = the row was checked at its first and last entry (signed by a trusted key, and "
    "what the row says); the entries between were not: `truss ledger verify SESSION` (or --all) checks them; "
    "no = not checked at all"
)


def verified_cell(verified: str | None) -> str:
    """The VERIFIED column of a session listing: ``chain``, ``ends`` or ``no``."""
    return _VERIFIED.get(verified, "no")


def row_limit(value: int) -> int | None:
    """A command's ``--limit N``: at most N rows; 0 means all (None); a negative number is refused."""
    if value < 0:
        raise UsageError(f"--limit {value}: give a number of rows, or 0 for all", remedy="See the command's --help")
    return None if value == 0 else value
