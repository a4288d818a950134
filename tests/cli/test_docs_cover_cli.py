"""docs/cli.md names every command and every long option the parser accepts, so the reference
cannot drift from the tool without a test failing."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from truss_cli.main import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], list[str]]]:
    found: list[tuple[tuple[str, ...], list[str]]] = []
    flags = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"})
    found.append((path, flags))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):  # pyright: ignore[reportPrivateUsage]
            for name, child in action.choices.items():  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
                assert isinstance(child, argparse.ArgumentParser)
                found.extend(_walk(child, (*path, str(name))))  # pyright: ignore[reportUnknownArgumentType]
    return found


def test_every_command_and_long_option_appears_in_docs_cli_md() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing: list[str] = []
    for path, flags in _walk(build_parser(), ()):
        if path and not re.search(r"truss\s+" + r"\s+".join(map(re.escape, path)) + r"\b", text):
            missing.append("truss " + " ".join(path))
        missing.extend(f"truss {' '.join(path)} {flag}" for flag in flags if flag not in text)
    assert missing == []
