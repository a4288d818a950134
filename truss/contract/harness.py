"""The operator's ``[harness]`` table read on its own, for what needs it without a contract.

A run reads ``[harness]`` as part of its effective contract (``truss.contract.models.Harness``,
merged by the loader). ``truss ledger sweep``, serve-mcp's retention at start and ``truss status``
need the same table with no contract at hand: its ``keep`` (retention) and ``quotas``. This module
validates that one table of ``$TRUSS_HOME/config.toml`` with the same model, so both readings
agree. Pure, but for ``load_operator_harness`` reading the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from truss.contract.fields import Model, duration_ms
from truss.contract.layers import harness_settings, parse_layer, read_toml_file
from truss.contract.models import Harness
from truss.contract.validation import from_validation

__all__ = ["HarnessConfig", "harness_from_text", "keep_ms", "load_operator_harness"]


class HarnessConfig(Model):
    """The part of an operator config this module reads: its ``[harness]`` table."""

    harness: Harness = Harness()


def harness_from_text(text: str, *, file: str) -> Harness:
    """The ``[harness]`` table of an operator config's TOML text (defaults when it has none). No I/O."""
    layer = parse_layer(text, file=file, role="operator config")
    table: Any = layer.data.get("harness")
    if table is None:
        return Harness()
    data = {"harness": harness_settings(table)}  # ``db`` is read by truss.contract.harness_db
    try:
        return HarnessConfig.model_validate(data).harness
    except ValidationError as exc:
        raise from_validation(exc, [layer], data, root=HarnessConfig) from None


def load_operator_harness(home: Path | str) -> Harness:
    """The ``[harness]`` table of ``HOME/config.toml``; the defaults when the file or table is absent."""
    path = Path(home) / "config.toml"
    if not path.exists():
        return Harness()
    return harness_from_text(read_toml_file(path, role="operator config"), file=str(path))


def keep_ms(harness: Harness) -> int | None:
    """How long an ended session's payloads are kept (``keep``), in ms; None: forever (the default)."""
    if harness.keep is None or harness.keep == "forever":
        return None
    return duration_ms(harness.keep)
