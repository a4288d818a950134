"""Bad input to the witness commands and options: one clear paragraph, a documented exit code, no
traceback, nothing recorded wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.witness.support import make_home, make_witness, record_sessions, truss, write_witness_config

pytestmark = pytest.mark.slow  # `truss` in subprocesses


def _clean(proc_stderr: str) -> None:
    assert "Traceback" not in proc_stderr and proc_stderr.startswith("truss")


def test_init_refuses_to_overwrite_a_witness_key(tmp_path: Path) -> None:
    witness = make_witness(tmp_path, "w1")
    again = truss(None, "witness", "init", "--dir", str(witness.directory), "--name", "witness.test/w1")
    assert again.returncode == 2
    _clean(again.stderr)
    assert "already exists" in again.stderr


def test_serve_without_a_config_or_with_a_bad_log_key_exits_2_naming_the_file(tmp_path: Path) -> None:
    missing = truss(None, "witness", "serve", "--dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no config file" in missing.stderr
    _clean(missing.stderr)
    witness = make_witness(tmp_path, "w1")
    (witness.directory / "config.toml").write_text('[[log]]\nkeys = ["not a key"]\n', encoding="utf-8")
    bad = truss(None, "witness", "serve", "--dir", str(witness.directory))
    assert bad.returncode == 2 and "config.toml" in bad.stderr and "log[0].keys" in bad.stderr
    (witness.directory / "config.toml").write_text("max_per_minute = 0\n", encoding="utf-8")
    assert truss(None, "witness", "show", "--dir", str(witness.directory)).returncode == 2


def test_checkpoint_witness_needs_a_witness_config_and_names_what_is_wrong_in_one(tmp_path: Path) -> None:
    home, key = make_home(tmp_path)
    record_sessions(home, key, ["s_one"])
    none = truss(home, "ledger", "checkpoint", "--witness")
    assert none.returncode == 2 and "witness.toml" in none.stderr
    _clean(none.stderr)
    (home / "witness.toml").write_text('policy = "p.policy"\nthrottle = "1m"\n', encoding="utf-8")
    unknown = truss(home, "ledger", "checkpoint", "--witness")
    assert unknown.returncode == 2 and "throttle" in unknown.stderr
    write_witness_config(home, policy="p.policy")
    (home / "p.policy").write_text("witness w1 nonsense\nquorum w1\n", encoding="utf-8")
    bad_line = truss(home, "ledger", "checkpoint", "--witness")
    assert bad_line.returncode == 2 and "p.policy:1" in bad_line.stderr
    _clean(bad_line.stderr)
    no_file = truss(home, "ledger", "verify", "--policy", str(tmp_path / "absent.policy"))
    assert no_file.returncode == 2 and "absent.policy" in no_file.stderr
    assert truss(home, "ledger", "verify").returncode == 0, "nothing was recorded by the refused commands"
