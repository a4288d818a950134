"""Attack: text from an untrusted party (a tool result, a tool name a model made up) carrying
terminal control sequences, aimed at the operator's terminal through Truss's human output.

Every output the CLI prints is checked for characters a terminal would obey; the escapes must
still be visible (an auditor should see that something odd was there), and the ledger keeps the
exact bytes the server sent.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.durability.support import cli
from tests.providers._support import LoopbackServer, Reply
from tests.security._support import DATA, hostile_contract, truss, unsafe_characters


def test_a_tool_result_with_terminal_escapes_is_shown_escaped_by_ledger_show(tmp_path: Path, home: Path) -> None:
    run = truss(home, "--json", "run", str(hostile_contract(tmp_path)))
    assert run.returncode == 0, run.stderr
    session = json.loads(run.stdout)["session"]

    views = (["ledger", "show", session], ["ledger", "show", session, "--full"], ["--json", "ledger", "show", session])
    for args in views:
        shown = cli(home, *args)
        assert shown.returncode == 0, shown.stderr
        assert unsafe_characters(shown.stdout + shown.stderr) == [], args
        assert "pwned" in shown.stdout  # shown, not hidden

    full = cli(home, "ledger", "show", session, "--full").stdout
    assert "\\x9b2J" in full and "\\u202eevil" in full
    # The JSON form is the same value, escaped: a machine reading it gets the server's exact text.
    entries = json.loads(cli(home, "--json", "ledger", "show", session).stdout)["entries"]
    texts = [
        block["text"]
        for entry in entries
        for view in entry["payloads"].values()
        if isinstance(view.get("value"), dict)
        for block in view["value"].get("content", [])
    ]
    assert "hi\x1b]0;pwned\x07\x9b2J\u202eevil" in texts


def test_a_tool_name_a_model_made_up_with_escapes_is_shown_escaped_in_progress_lines(
    tmp_path: Path, home: Path
) -> None:
    model = LoopbackServer().start()
    try:
        model.reply(
            Reply(body=json.loads((DATA / "model_tool_name_with_terminal_escapes.json").read_text())),
            Reply(body={"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}]}),
        )
        agent = f'[agent]\nprovider = "openai"\nmodel = "m"\nbase_url = "{model.url}/v1"\napi_key_env = "MODEL_KEY"\n'
        contract = hostile_contract(tmp_path, agent=agent)
        run = truss(home, "-v", "run", str(contract), env={"MODEL_KEY": "sk-test-key-000"})
    finally:
        model.close()
    assert run.returncode == 0, run.stderr
    assert unsafe_characters(run.stdout + run.stderr) == []
    assert "denied (not_mounted)" in run.stderr and "\\x1b]0;pwned" in run.stderr
