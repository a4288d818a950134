"""The wheel holds every package of the source tree: an editable install hides a package left out."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(config["tool"]["setuptools"]["packages"])


def test_every_package_under_truss_is_listed_for_the_wheel() -> None:
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "truss").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    missing = sorted(found - _declared())
    assert not missing, f"packages missing from [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_listed_package_exists() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapped: dict[str, str] = config["tool"]["setuptools"].get("package-dir", {})
    for name in _declared():
        top, _, rest = name.partition(".")
        base = ROOT / mapped.get(top, top)
        assert (base.joinpath(*rest.split(".")) if rest else base).joinpath("__init__.py").is_file(), name
