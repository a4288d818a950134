"""docs/witness.md's examples are real (the policy, witness.toml and a witness's config.toml load),
and every reason code the witness and rotation steps use is in docs/ledger-format.md."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO
from truss.ledger.tlog_policy import parse_policy
from truss.witness.config import load_settings
from truss.witness.state import load_dir_config

DOC = (REPO / "docs" / "witness.md").read_text(encoding="utf-8")
FORMAT = (REPO / "docs" / "ledger-format.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.DOTALL)


def test_the_policy_and_witness_toml_examples_load_as_written(tmp_path: Path) -> None:
    [policy] = _blocks("")[:1]
    parsed = parse_policy(policy, file="docs/witness.md")
    assert parsed.quorum == "both" and sorted(parsed.witnesses) == ["audit-a", "audit-b"]
    operator, witness = _blocks("toml")
    (tmp_path / "witnesses.policy").write_text(policy, encoding="utf-8")
    (tmp_path / "witness.toml").write_text(operator, encoding="utf-8")
    settings = load_settings(tmp_path)
    assert settings is not None and settings.min_interval_ms == 60_000 and settings.retries == 2
    (tmp_path / "config.toml").write_text(witness, encoding="utf-8")
    assert list(load_dir_config(tmp_path).logs) == ["truss.local/fa3b72f9859e9010"]


def test_every_reason_code_of_the_witness_and_rotation_steps_is_documented() -> None:
    sources = [
        REPO / "truss" / "ledger" / name
        for name in ("keyhistory.py", "witnessed.py", "tlog_policy.py", "cosignature.py")
    ] + [REPO / "truss" / "witness" / "client.py"]
    codes: set[str] = set()
    for path in sources:
        text = path.read_text(encoding="utf-8")
        codes.update(re.findall(r'reason="([a-z_]+)"', text))
        codes.update(re.findall(r'reason=\(?"([a-z_]+)"', text))
        codes.update(re.findall(r'"refused", "([a-z_]+)"', text))
        codes.update(re.findall(r'"unreachable", "([a-z_]+)"', text))
        codes.update(re.findall(r'step="W\d", reason="([a-z_]+)"', text))
    codes.update({"key_retired", "forged_rotation", "bad_rotation", "retired_key"})
    codes.discard("bad_fields")  # a bundle that cannot be parsed (B1): unusable input, not a finding
    missing = sorted(c for c in codes if f"`{c}`" not in FORMAT)
    assert not missing, f"reason codes not in docs/ledger-format.md: {missing}"
    assert len(codes) > 15
