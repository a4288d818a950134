"""Builds the ledger's golden vectors and tampered fixtures (data files under this directory).

The files are the test data; this module is how they were made, kept so a reader can see each
attack as code. Regenerate with ``python -m tests.ledger._fixtures`` only when the entry format
changes on purpose: the golden-vector test exists to fail when any byte changes by accident.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from truss.ledger.canonical import sha256_ref
from truss.ledger.entry import PAYLOAD_TYPE, Record, StoredEntry, entry_bytes, pae, seal
from truss.ledger.keys import IdentityKey
from truss.testing import ManualClock, MemoryStore

HERE = Path(__file__).parent
VECTORS = HERE / "vectors" / "entry"
TAMPERED = HERE / "tampered"

GOLDEN_SEED = hashlib.sha256(b"truss golden vector key").digest()
GOLDEN_NAME = "golden.truss.test"
OTHER_SEED = hashlib.sha256(b"truss attacker key").digest()
FORMAT = "truss-ledger-fixture/1"


def golden_key() -> IdentityKey:
    return IdentityKey.from_seed(GOLDEN_SEED, GOLDEN_NAME)


def _payload(value: Any) -> tuple[str, bytes]:
    data = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return sha256_ref(data), data


def build_store(key: IdentityKey, factory: Callable[[IdentityKey, ManualClock], Any] | None = None) -> Any:
    """Two interleaved sessions: ``s_alpha`` (7 entries, with payloads) and ``s_beta`` (4)."""
    clock = ManualClock()
    store = MemoryStore(key=key, clock=clock) if factory is None else factory(key, clock)
    args_ref, args = _payload({"repo_path": "/srv/work/demo"})
    result_ref, result = _payload({"content": [{"type": "text", "text": "On branch main"}], "isError": False})
    store.append(
        "s_alpha", [Record("session_started", {"contract": "repo-triage", "contract_hash": "sha256:" + "ab" * 32})]
    )
    clock.advance(0.25)
    store.append("s_beta", [Record("session_started", {"contract": "other"})])
    store.append(
        "s_alpha", [Record("model_turn", {"request": "sha256:" + "01" * 32, "usage": {"input": 120, "output": 8}})]
    )
    clock.advance(0.5)
    store.append(
        "s_alpha",
        [Record("mcp_tool_intent", {"call": "c1", "tool": "mcp:git:git_status", "args": args_ref}, {args_ref: args})],
    )
    store.append("s_beta", [Record("model_turn", {"request": "sha256:" + "02" * 32})])
    clock.advance(0.125)
    store.append(
        "s_alpha",
        [
            Record(
                "mcp_tool_call",
                {"call": "c1", "tool": "mcp:git:git_status", "args": args_ref, "result": result_ref, "is_error": False},
                {result_ref: result},
            )
        ],
    )
    store.append("s_alpha", [Record("model_turn", {"request": "sha256:" + "03" * 32, "text": "naïve ✓ \u2028 done"})])
    store.append("s_beta", [Record("mcp_tool_denied", {"call": "c9", "tool": "mcp:fs:write", "reason": "policy"})])
    store.append("s_alpha", [Record("verdict", {"status": "pass", "checks": [{"kind": "tool_succeeded", "ok": True}]})])
    store.append("s_alpha", [Record("session_ended", {"status": "pass"})])
    store.append("s_beta", [Record("session_ended", {"status": "fail"})])
    return store


def _blobs_of(store: MemoryStore, entries: list[StoredEntry]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        for ref in entry.refs():
            data = store.blob(ref)
            if data is not None:
                out[ref] = base64.b64encode(data).decode()
    return out


def _fixture(
    attack: str,
    summary: str,
    key: IdentityKey,
    session: str,
    entries: list[dict[str, Any]],
    blobs: dict[str, str],
    expect: dict[str, Any],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "attack": attack,
        "summary": summary,
        "trusted": [key.verifier.vkey],
        "origin": key.name,
        "session": session,
        "expect": expect,
        "entries": entries,
        "blobs": blobs,
    }


def _rehash(item: dict[str, Any]) -> None:
    """What a careful attacker does after editing an entry: restate its hash."""
    item["hash"] = hashlib.sha256(entry_bytes(item["entry"])).hexdigest()


def tampered(key: IdentityKey) -> dict[str, dict[str, Any]]:
    store = build_store(key)
    alpha = list(store.read_session("s_alpha"))
    beta = list(store.read_session("s_beta"))
    clean = [e.to_json() for e in alpha]
    blobs = _blobs_of(store, alpha)
    out: dict[str, dict[str, Any]] = {}

    def add(
        name: str, summary: str, entries: list[dict[str, Any]], expect: dict[str, Any], b: dict[str, str] | None = None
    ) -> None:
        out[name] = _fixture(name, summary, key, "s_alpha", entries, blobs if b is None else b, expect)

    add("clean_session", "an untouched session: verifies", copy.deepcopy(clean), {"ok": True})

    e = copy.deepcopy(clean)
    e[2]["entry"]["body"]["tool"] = "mcp:git:git_statuz"
    _rehash(e[2])
    add(
        "flipped_byte_in_body",
        "one byte of a body changed, hash restated",
        e,
        {"ok": False, "reason": "bad_signature", "seq": 2},
    )

    e = copy.deepcopy(clean)
    sig = bytearray(base64.b64decode(e[3]["sig"]))
    sig[10] ^= 0x01
    e[3]["sig"] = base64.b64encode(bytes(sig)).decode()
    add(
        "flipped_byte_in_signature",
        "one bit of a signature flipped",
        e,
        {"ok": False, "reason": "bad_signature", "seq": 3},
    )

    e = copy.deepcopy(clean)
    prev = e[3]["entry"]["prev"]
    e[3]["entry"]["prev"] = ("1" if prev[0] != "1" else "2") + prev[1:]
    _rehash(e[3])
    add(
        "flipped_byte_in_prev",
        "one hex digit of prev changed, hash restated",
        e,
        {"ok": False, "reason": "prev_mismatch", "seq": 3},
    )

    e = copy.deepcopy(clean)
    e[2]["hash"] = "0" + e[2]["hash"][1:] if e[2]["hash"][0] != "0" else "1" + e[2]["hash"][1:]
    add(
        "forged_stated_hash",
        "the stated hash of an entry replaced",
        e,
        {"ok": False, "reason": "hash_mismatch", "seq": 2},
    )

    e = copy.deepcopy(clean)
    e[2], e[3] = e[3], e[2]
    add("swapped_entries", "two neighbouring entries swapped", e, {"ok": False, "reason": "reordered", "seq": 3})

    e = copy.deepcopy(clean)
    del e[3]
    add("removed_from_middle", "an entry removed from the middle", e, {"ok": False, "reason": "seq_gap", "seq": 4})

    e = copy.deepcopy(clean)
    e.insert(3, copy.deepcopy(e[2]))
    add(
        "duplicated_seq",
        "an entry repeated (the same seq twice)",
        e,
        {"ok": False, "reason": "seq_duplicate", "seq": 2},
    )

    e = copy.deepcopy(clean)
    e.insert(3, beta[1].to_json())
    add(
        "spliced_from_other_session",
        "a validly signed entry of another session inserted",
        e,
        {"ok": False, "reason": "foreign_session", "seq": 1},
    )

    e = copy.deepcopy(clean)
    e[3]["entry"]["kind"] = "mcp_tool_denied"
    _rehash(e[3])
    add(
        "kind_changed",
        "a call recorded as denied instead (hash restated)",
        e,
        {"ok": False, "reason": "bad_signature", "seq": 3},
    )

    other = IdentityKey.from_seed(OTHER_SEED, key.name)
    resigned: list[dict[str, Any]] = []
    prev_hash = "0" * 64
    for item in alpha:
        body = copy.deepcopy(item.body)
        if item.kind == "verdict":
            body["status"] = "fail"
        sealed = seal(
            other,
            log=item.log,
            session=item.session,
            seq=item.seq,
            index=item.index,
            ts=item.ts,
            kind=item.kind,
            body=body,
            prev=prev_hash,
        )
        prev_hash = sealed.hash
        resigned.append(sealed.to_json())
    add(
        "resigned_with_other_key",
        "the whole session rewritten and re-signed by a key that is not trusted",
        resigned,
        {"ok": False, "reason": "untrusted_key", "seq": 0},
    )

    changed = dict(blobs)
    ref = alpha[3].body["result"]
    changed[ref] = base64.b64encode(base64.b64decode(changed[ref]).replace(b"main", b"evil")).decode()
    add(
        "changed_blob",
        "the stored result bytes of a call changed",
        copy.deepcopy(clean),
        {"ok": False, "reason": "blob_mismatch", "seq": 3},
        changed,
    )

    e = copy.deepcopy(clean)
    e[1]["entry"]["log"] = "elsewhere.truss.test"
    _rehash(e[1])
    add(
        "moved_to_other_log",
        "an entry claiming another log's origin",
        e,
        {"ok": False, "reason": "wrong_log", "seq": 1},
    )
    return out


def golden(key: IdentityKey) -> dict[str, Any]:
    store = build_store(key)
    entries = list(store.read_range(0, store.tree_size()))
    return {
        "format": "truss-ledger-golden/1",
        "key": {"seed_hex": GOLDEN_SEED.hex(), "name": key.name, "vkey": key.verifier.vkey, "key_id": key.key_id},
        "payload_type": PAYLOAD_TYPE,
        "entries": [
            {
                "entry": e.entry,
                "canonical": e.raw.decode("utf-8"),
                "hash": e.hash,
                "pae_b64": base64.b64encode(pae(PAYLOAD_TYPE, e.raw)).decode(),
                "sig_b64": base64.b64encode(e.sig).decode(),
                "keyid": e.keyid,
            }
            for e in entries
        ],
        "tree_size": store.tree_size(),
        "tree_root_hex": store.tree_root().hex(),
    }


def _write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    key = golden_key()
    VECTORS.mkdir(parents=True, exist_ok=True)
    TAMPERED.mkdir(parents=True, exist_ok=True)
    _write(VECTORS / "golden_session.json", golden(key))
    for name, fixture in tampered(key).items():
        _write(TAMPERED / f"{name}.json", fixture)


if __name__ == "__main__":
    main()
