"""Regenerate the tampered bundles in this directory, each named after its attack.

Run from the repository root: ``python tests/ledger/tampered_bundles/regenerate.py``. The ledger
they are cut from is ``tests.ledger.test_bundle.build_ledger`` (fixed-seed test keys, a manual
clock), so the output is the same bytes every time; the files, not this script, are the test data.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tests.ledger.test_bundle import (  # noqa: E402
    LOG_NAME,
    OTHER_SESSION,
    VERDICT_SESSION,
    build_ledger,
    export,
    flip_b64,
    log_key,
    stranger_key,
    tamper,
)
from truss.ledger.bundle import format_tlog_proof, parse_tlog_proof  # noqa: E402
from truss.ledger.canonical import canonical, sha256_ref  # noqa: E402
from truss.ledger.envelope import sign_verdict, verdict_statement  # noqa: E402
from truss.ledger.note import format_checkpoint, parse_checkpoint, parse_note, sign_note  # noqa: E402


def _with_checkpoint(doc: dict[str, Any], note: bytes) -> dict[str, Any]:
    proof = parse_tlog_proof(doc["proof"])
    replaced = format_tlog_proof(type(proof)(proof.index, proof.hashes, note))
    return tamper(doc, checkpoint=note.decode(), proof=replaced)


def main() -> None:
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ledger = build_ledger(Path(tmp) / "ledger.db")
        original: dict[str, Any] = json.loads(export(ledger))
        other: dict[str, Any] = json.loads(export(ledger, OTHER_SESSION))
        fork = build_ledger(Path(tmp) / "fork.db", rewrite_other=True)
        forked: dict[str, Any] = json.loads(export(fork))
        resigned: dict[str, Any] = json.loads(export(build_ledger(Path(tmp) / "s.db", key=stranger_key())))
        ledger.store.close()
        fork.store.close()

    def put(name: str, doc: dict[str, Any]) -> None:
        files[f"{name}.json"] = canonical(doc)

    put("original", original)
    entries, inclusion = original["entries"], original["inclusion"]
    checkpoint = parse_checkpoint(parse_note(original["checkpoint"].encode()).text)
    body = format_checkpoint(LOG_NAME, checkpoint.size, checkpoint.root)

    proof_lines = original["proof"].split("\n")
    proof_lines[2] = flip_b64(proof_lines[2])
    put("proof_hash_changed", tamper(original, proof="\n".join(proof_lines)))

    changed = json.loads(json.dumps(inclusion))
    changed[4][0] = flip_b64(changed[4][0])
    put("inclusion_proof_of_a_middle_entry_changed", tamper(original, inclusion=changed))

    swapped = list(inclusion)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    put("middle_entries_proofs_swapped", tamper(original, inclusion=swapped))

    wrong_size = original["checkpoint"].replace(f"\n{checkpoint.size}\n", f"\n{checkpoint.size + 1}\n", 1)
    put("wrong_tree_size", _with_checkpoint(original, wrong_size.encode()))

    head_index = entries[-1]["entry"]["index"]
    moved_index = original["proof"].replace(f"index {head_index}\n", f"index {head_index - 1}\n", 1)
    put("proof_index_of_another_entry", tamper(original, proof=moved_index))

    put("checkpoint_signed_by_unknown_key", _with_checkpoint(original, sign_note(body, [stranger_key()])))
    put("checkpoint_extension_lines_added", _with_checkpoint(original, sign_note(body + "extra/ext 1\n", [log_key()])))

    put("fork_same_size_different_root", tamper(forked, envelope=original["envelope"]))

    put(
        "entries_removed_from_the_middle",
        tamper(original, entries=entries[:3] + entries[4:], inclusion=inclusion[:3] + inclusion[4:]),
    )
    put("entries_removed_from_the_end", tamper(original, entries=entries[:-1], inclusion=inclusion[:-1]))

    reordered, reordered_proofs = list(entries), list(inclusion)
    reordered[3], reordered[4] = reordered[4], reordered[3]
    reordered_proofs[3], reordered_proofs[4] = reordered_proofs[4], reordered_proofs[3]
    put("entries_reordered", tamper(original, entries=reordered, inclusion=reordered_proofs))

    put(
        "entry_spliced_from_another_session",
        tamper(
            original,
            entries=[*entries[:3], other["entries"][1], *entries[3:]],
            inclusion=[*inclusion[:3], other["inclusion"][1], *inclusion[3:]],
        ),
    )

    moved = sign_verdict(
        verdict_statement(
            session=VERDICT_SESSION,
            head=other["entries"][-1]["hash"],
            status="pass",
            checks=[],
            contract_hash="sha256:x",
            checkpoint=original["checkpoint"],
        ),
        log_key(),
    )
    put("verdict_envelope_points_at_another_sessions_head", tamper(original, envelope=moved.to_json()))
    put("verdict_envelope_of_another_session", tamper(original, envelope=other["envelope"]))

    statement = json.loads(base64.b64decode(original["envelope"]["payload"]))
    statement["predicate"]["status"] = "fail"
    envelope = dict(original["envelope"], payload=base64.b64encode(canonical(statement)).decode())
    put("verdict_envelope_status_changed", tamper(original, envelope=envelope))

    blobs = dict(original["blobs"])
    first_ref = sorted(blobs)[0]
    blobs[first_ref] = base64.b64encode(b'{"content":[{"text":"On branch evil"}]}').decode()
    put("payload_changed", tamper(original, blobs=blobs))

    extra = dict(original["blobs"])
    extra[sha256_ref(b"smuggled")] = base64.b64encode(b"smuggled").decode()
    put("payload_added_that_no_entry_names", tamper(original, blobs=extra))

    put("whole_bundle_resigned_by_another_key", resigned)

    files["not_json.json"] = b'{"format": "truss-bundle", '
    put("wrong_format_tag", tamper(original, format="truss-bundle-v0"))
    put("unknown_field", tamper(original, note="trust me"))
    files["nested_too_deep.json"] = b"[" * 1000 + b"]" * 1000
    missing_sig = json.loads(json.dumps(entries))
    del missing_sig[2]["sig"]
    put("entry_missing_its_signature", tamper(original, entries=missing_sig))

    # json.loads reads "\ud800" as a lone surrogate, which no UTF-8 encoder takes: canonical()
    # refuses it too, so these two are written with json.dumps (its escapes keep the files ASCII).
    def put_escaped(name: str, doc: dict[str, Any]) -> None:
        files[f"{name}.json"] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")

    surrogate_note = original["checkpoint"].replace("\n", "\ud800\n", 1)
    put_escaped("checkpoint_holding_a_lone_surrogate", tamper(original, checkpoint=surrogate_note))
    head, _, note = original["proof"].partition("\n\n")
    put_escaped("tlog_proof_holding_a_lone_surrogate", tamper(original, proof=f"{head}\n\n{note[:4]}\udfff{note[4:]}"))

    for name, data in files.items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
