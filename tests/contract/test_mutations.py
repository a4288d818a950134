"""Mutated contract texts either load or fail with exit 2 and a one-paragraph message; nothing else.

Hypothesis deletes, duplicates and replaces characters and lines of valid contracts. The loader
runs in-process for speed, and so does the CLI's entry point (parser, loader, error handler).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from truss_cli.main import main

from truss import InputError
from truss.contract import load_contract_text

CONTRACTS = Path(__file__).resolve().parent.parent.parent / "contracts"
SOURCES = [p.read_text() for p in sorted(CONTRACTS.glob("*.toml"))]
SIGNIFICANT = [*"[]{}=\",'#.\n\\$-_ 0123456789azAZ", "${", "${params.", "${env.", "}", '"""', "\x00", "é"]
KINDS = ["delete", "duplicate", "replace", "insert", "drop_line", "dup_line", "swap_lines"]


@st.composite
def mutated(draw: st.DrawFn, sources: list[str] = SOURCES) -> str:
    text = draw(st.sampled_from(sources))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(
            st.sampled_from(["delete", "duplicate", "replace", "insert", "drop_line", "dup_line", "swap_lines"])
        )
        if kind in ("drop_line", "dup_line", "swap_lines"):
            lines = text.split("\n")
            i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            j = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            if kind == "drop_line":
                del lines[i]
            elif kind == "dup_line":
                lines.insert(i, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
            continue
        if not text:
            break
        i = draw(st.integers(min_value=0, max_value=len(text) - 1))
        if kind == "delete":
            text = text[:i] + text[i + 1 :]
        elif kind == "duplicate":
            text = text[:i] + text[i] + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(SIGNIFICANT)) + text[i + 1 :]
        else:
            text = text[:i] + draw(st.sampled_from(SIGNIFICANT)) + text[i:]
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_contract_loads_or_fails_with_a_located_input_error(text: str) -> None:
    try:
        contract = load_contract_text(text, source="mutant.toml")
    except InputError as exc:
        message = exc.diagnostics()
        assert message.startswith("mutant.toml")
        assert "\n" not in message
        assert exc.remedy
        assert exc.exit_code == 2
    else:
        assert contract.hash.startswith("sha256:")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_contract_through_the_cli_exits_0_or_2_without_a_traceback(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutant.toml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        home = ["--home", str(Path(tmp) / "home")]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*home, "contract", "check", str(path)])
        assert code in (0, 2), err.getvalue()
        assert "Traceback" not in err.getvalue()
        assert "internal error" not in err.getvalue()
        if code == 2:
            assert err.getvalue().count("\n") == 1
            return
        assert "hash: sha256:" in out.getvalue()
        # What loads also shows: the TOML `show` prints reads back as the JSON form `--json` prints.
        shown, as_json = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(io.StringIO()):
            assert main([*home, "contract", "show", str(path)]) == 0
        with contextlib.redirect_stdout(as_json), contextlib.redirect_stderr(io.StringIO()):
            assert main([*home, "--json", "contract", "show", str(path)]) == 0
        assert tomllib.loads(shown.getvalue()) == json.loads(as_json.getvalue())["contract"]


HELLO = (CONTRACTS / "hello.toml").read_text()
CONFIG = """[budget]
max_model_turns = 9
[agent]
max_parallel_calls = 2
[[mcp.servers]]
name = "time"
connect_timeout = "5s"
[harness]
allow_commands = ["mcp-server-time"]
"""
AGENT = '[agent]\nmax_turns = 5\nsystem = "be brief"\n'
OVERLAY = '[[mcp.servers]]\nname = "time"\ncall_timeout = "2s"\nenv = { TZ = "UTC" }\n'


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["config", "agent", "overlay"]),
    st.data(),
)
def test_mutated_config_agent_or_overlay_loads_or_fails_with_an_input_error(layer: str, data: st.DataObject) -> None:
    texts = {"config": CONFIG, "agent": AGENT, "overlay": OVERLAY}
    texts[layer] = data.draw(mutated([texts[layer]]))
    try:
        load_contract_text(
            HELLO,
            source="hello.toml",
            config=("config.toml", texts["config"]),
            agent=("agent.toml", texts["agent"]),
            overlay=("overlay.toml", texts["overlay"]),
        )
    except InputError as exc:
        assert "\n" not in exc.diagnostics()
        assert exc.remedy
