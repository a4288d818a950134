"""OpenTelemetry is an optional extra: Truss without it works unchanged and never loads it.

The ``otel`` extra is ``opentelemetry-proto`` (and the ``protobuf`` runtime it brings). Note what
"never loads OpenTelemetry" can mean here: the MCP SDK (a required dependency) itself depends on
``opentelemetry-api`` and imports it whenever the SDK loads, so a run, which connects servers
through the SDK, has the API package in memory whatever Truss does. What these tests pin is
Truss's part: ``import truss`` loads no ``opentelemetry`` module at all, a run without telemetry
configured loads nothing of the extra, only ``truss/telemetry/_proto.py`` imports it, and with the
extra hidden a run works and configured telemetry is a clear error before anything is recorded.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.telemetry.conftest import TIMEOUT, telemetry_config, tools_contract, truss, write_config
from truss.telemetry import EXTRA

EXTRA_MODULES = ("opentelemetry.proto", "google.protobuf")
ECHO = '[[agent.steps]]\ntool = "mcp:tools:echo"\narguments = { text = "no telemetry" }\n'

# Installed as sitecustomize on PYTHONPATH: the extra's packages cannot be imported (or found).
HIDER = """
import sys
from importlib.abc import MetaPathFinder

HIDDEN = ("opentelemetry.proto", "google.protobuf")


class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in HIDDEN or name.startswith(tuple(h + "." for h in HIDDEN)):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, Hide())
"""


def _loaded(stderr: str) -> list[str]:
    """Module names from ``python -X importtime`` output."""
    out: list[str] = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            out.append(line.rsplit("|", 1)[1].strip())
    return out


def test_import_truss_and_its_telemetry_package_load_no_opentelemetry_module() -> None:
    code = (
        "import sys, truss, truss.telemetry, truss.session, truss_cli.main, truss_cli._telemetry; "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'google.protobuf'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_run_without_telemetry_configured_loads_nothing_of_the_otel_extra(tmp_path: Path, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(TRUSS_HOME=str(home), PYTHONPROFILEIMPORTTIME="1")
    contract = tools_contract(tmp_path, ECHO)
    done = subprocess.run(
        [sys.executable, "-m", "truss", "run", str(contract)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = _loaded(done.stderr)
    assert "truss.session" in loaded  # the run did happen in this process
    assert not [m for m in loaded if m.startswith(EXTRA_MODULES)]


def test_only_the_protobuf_encoder_of_truss_imports_opentelemetry() -> None:
    importers: set[str] = set()
    for root in ("truss", "cli"):
        for path in (REPO / root).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n == "opentelemetry" or n.startswith(("opentelemetry.", "google.protobuf")) for n in names):
                    importers.add(str(path.relative_to(REPO)))
    assert importers == {"truss/telemetry/_proto.py"}


def test_with_the_extra_hidden_a_run_works_unchanged_and_configured_telemetry_is_a_clear_error(
    tmp_path: Path, home: Path
) -> None:
    hider = tmp_path / "hider"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDER, encoding="utf-8")
    hidden = {"PYTHONPATH": os.pathsep.join([str(hider), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    contract = tools_contract(tmp_path, ECHO)

    check = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('opentelemetry.proto'))"],
        capture_output=True, text=True, env={**os.environ, **hidden}, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert "hidden by the test" in check.stderr  # the hider works: the extra cannot be found

    plain = truss(home, "--json", "run", str(contract), env=hidden)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["status"] == "pass" and "telemetry" not in json.loads(plain.stdout)

    write_config(home, telemetry_config("http://127.0.0.1:4318"))
    before = truss(home, "--json", "sessions").stdout
    refused = truss(home, "--json", "run", str(contract), env=hidden)
    assert refused.returncode == 2
    error = json.loads(refused.stdout)
    assert error["error"] == "UsageError" and EXTRA in error["remedy"] and error["extra"] == "otel"
    assert truss(home, "--json", "sessions").stdout == before  # nothing was started or recorded

    by_env = truss(home, "--json", "run", str(contract), env={**hidden, "OTEL_SDK_DISABLED": "true"})
    assert by_env.returncode == 0, by_env.stderr  # the standard switch turns it off again
