"""Regenerate the checkpoint fixtures in this directory (Ed25519 is deterministic: same bytes).

Run from the repository root: ``python tests/ledger/vectors/note/regenerate.py``. The keys are
test-only keys derived from fixed seeds; never use them for anything else.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from truss.ledger.keys import IdentityKey
from truss.ledger.merkle import MemoryTree
from truss.ledger.note import format_checkpoint, sign_note

HERE = Path(__file__).parent
ORIGIN = "truss.test/log"


def test_key(label: str, name: str = ORIGIN) -> IdentityKey:
    return IdentityKey.from_seed(hashlib.sha256(label.encode()).digest(), name)


def main() -> None:
    log_key = test_key("truss test log key")
    stranger = test_key("a stranger's key under the same name")
    tree = MemoryTree()
    for i in range(5):
        tree.append(f"entry {i}".encode())
    fork = MemoryTree()
    for i in range(5):
        fork.append(f"entry {i}".encode() if i != 2 else b"rewritten entry 2")
    body = format_checkpoint(ORIGIN, 5, tree.root())
    valid = sign_note(body, [log_key])
    files = {
        "test_log.vkey": (log_key.verifier.vkey + "\n").encode(),
        "checkpoint_valid.note": valid,
        "checkpoint_signed_by_unknown_key.note": sign_note(body, [stranger]),
        "checkpoint_extension_lines_added.note": sign_note(body + "extra/ext 1\n", [log_key]),
        "checkpoint_extension_line_inserted_after_signing.note": valid.replace(b"\n\n", b"\nextra/ext 1\n\n", 1),
        "checkpoint_wrong_tree_size.note": valid.replace(b"\n5\n", b"\n6\n", 1),
        "checkpoint_root_changed.note": sign_note(body, [log_key]).replace(
            format_checkpoint(ORIGIN, 5, tree.root()).encode(),
            format_checkpoint(ORIGIN, 5, fork.root()).encode(),
        ),
        "checkpoint_fork_same_size_other_root.note": sign_note(format_checkpoint(ORIGIN, 5, fork.root()), [log_key]),
        "checkpoint_origin_is_not_the_key_name.note": sign_note(
            format_checkpoint("truss.test/elsewhere", 5, tree.root()), [log_key]
        ),
        "checkpoint_unknown_signature_line_added.note": valid + sign_note(body, [stranger]).split(b"\n\n", 1)[1],
        # C2SP bans only characters below U+0020 in a note: a cosigner's name may hold DEL, and a
        # verifier that does not know the cosigner ignores its line.
        "checkpoint_unknown_cosigner_with_del_in_its_name_added.note": valid
        + sign_note(body, [test_key("a witness nobody here knows", "witness\x7f.example")]).split(b"\n\n", 1)[1],
        "checkpoint_known_signature_fails_beside_a_good_one.note": valid
        + sign_note(body.replace("\n5\n", "\n6\n"), [log_key]).split(b"\n\n", 1)[1],
    }
    for name, data in files.items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
