"""Merkle log benchmark at 1,000,000 entries: append, checkpoint, inclusion proof, bundle check.

Run: ``.venv/bin/python bench/merkle.py [--entries N] [--rounds R]``. Each measure prints the
median of R rounds next to a baseline measured in the same run, and their ratio:

- append: sealing an entry (canonical bytes, SHA-256, Ed25519 over the DSSE PAE) with the
  incremental tree update (leaf hash, ``Frontier.append``, completed nodes stored) vs sealing
  without any tree. Also one full recomputation of the root from the leaves, which is what an
  append would cost without an incremental tree.
- checkpoint: root from the stored nodes (``root_at``) plus signing the checkpoint note, vs
  signing one entry.
- inclusion proof: ``inclusion_proof`` for random leaves of the full tree (target < 1 ms), and
  its verification.
- bundle: ``verify_bundle`` of a 100-entry session at the end of the 1M-entry log (per-entry
  inclusion proofs, the tlog-proof, the verdict envelope) vs verifying the same chain alone.

Nodes live in one Python list per level (the in-memory equivalent of the store's nodes table).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from truss.ledger.bundle import export_bundle, verify_bundle
from truss.ledger.entry import ZERO_HASH, StoredEntry, seal
from truss.ledger.envelope import sign_verdict, verdict_statement
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.merkle import Frontier, inclusion_proof, leaf_hash, node_hash, root_at, verify_inclusion
from truss.ledger.note import sign_checkpoint_note
from truss.ledger.verification import verify_entries

ORIGIN = "bench.truss.test"
SESSION = "s_bench"


class Tree:
    """A frontier plus every completed node, one list per level."""

    def __init__(self) -> None:
        self.frontier = Frontier()
        self.levels: list[list[bytes]] = []

    def append_leaf(self, leaf: bytes) -> None:
        for level, _index, value in self.frontier.append(leaf):
            if level == len(self.levels):
                self.levels.append([])
            self.levels[level].append(value)

    def get_node(self, level: int, index: int) -> bytes:
        return self.levels[level][index]


def _synthetic_leaf(index: int) -> bytes:
    # Entry-sized bytes (about 300) without paying for a signature per filler entry.
    text = (
        f'{{"body":{{"call":"c{index % 50}","result":"sha256:{"ab" * 32}","tool":"mcp:time:get_time"}},'
        f'"index":{index},"kind":"mcp_tool_call","log":"{ORIGIN}","prev":"{"cd" * 32}",'
        f'"seq":{index % 50},"session":"s_{index // 50:08d}","ts":{1_767_225_600_000 + index},"v":1}}'
    )
    return leaf_hash(text.encode())


def _median_time(fn: Callable[[], object], rounds: int) -> float:
    samples: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class _Source:
    """A ``BundleSource`` over the in-memory tree and one real session at its end."""

    def __init__(self, tree: Tree, entries: list[StoredEntry], key: IdentityKey) -> None:
        self.origin = ORIGIN
        self.tree = tree
        self.entries = entries
        self.key = key
        self._checkpoints: list[Any] = []
        self._envelope: bytes | None = None

    def session(self, session: str) -> object | None:
        return object() if session == SESSION else None

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[StoredEntry]:
        return iter(self.entries[from_seq:])

    def blob(self, ref: str) -> bytes | None:
        return None

    def erased_refs(self, session: str) -> set[str]:
        return set()

    def envelope(self, session: str) -> bytes | None:
        return self._envelope

    def tree_head(self) -> tuple[int, bytes]:
        return self.tree.frontier.size, self.tree.frontier.root()

    def node(self, level: int, index: int) -> bytes:
        return self.tree.get_node(level, index)

    def nodes(self, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return {(level, index): self.tree.get_node(level, index) for level, index in keys}

    def checkpoints(self) -> Sequence[Any]:
        return self._checkpoints

    def latest_checkpoint(self) -> Any:
        return max(self._checkpoints, key=lambda cp: cp.size, default=None)

    def checkpoint_covering(self, size: int) -> Any:
        return min((cp for cp in self._checkpoints if cp.size >= size), key=lambda cp: cp.size, default=None)

    def add_checkpoint(self, size: int, root: bytes, note: str) -> None:
        from truss.ledger.stores import StoredCheckpoint

        self._checkpoints.append(StoredCheckpoint(size, root, note))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sample", type=int, default=2000, help="entries sealed per append round")
    args = parser.parse_args()
    n: int = args.entries
    rounds: int = args.rounds
    key = IdentityKey.from_seed(hashlib.sha256(b"bench key").digest(), ORIGIN)
    trusted = TrustedKeys([key.verifier])

    # Build the log: filler leaves, then one real 100-entry session at the end.
    tree = Tree()
    session_len = 100
    start = time.perf_counter()
    for i in range(n - session_len):
        tree.append_leaf(_synthetic_leaf(i))
    prev = ZERO_HASH
    entries: list[StoredEntry] = []
    for seq in range(session_len):
        index = n - session_len + seq
        kind = "session_started" if seq == 0 else "session_ended" if seq == session_len - 1 else "mcp_tool_call"
        stored = seal(
            key,
            log=ORIGIN,
            session=SESSION,
            seq=seq,
            index=index,
            ts=1_767_225_600_000 + index,
            kind=kind,
            body={"call": f"c{seq}", "tool": "mcp:time:get_time", "result": "sha256:" + "ab" * 32},
            prev=prev,
        )
        entries.append(stored)
        tree.append_leaf(leaf_hash(stored.raw))
        prev = stored.hash
    build_s = time.perf_counter() - start
    print(f"built a {n:,}-entry tree in {build_s:.1f} s ({build_s / n * 1e6:.2f} us per leaf, incl. leaf hashing)")

    # 1. append: seal with vs without the incremental tree update, interleaved rounds.
    sample: int = args.sample
    counter = [n]

    def seal_one() -> StoredEntry:
        i = counter[0]
        counter[0] += 1
        return seal(
            key,
            log=ORIGIN,
            session="s_append",
            seq=i,
            index=i,
            ts=1_767_225_600_000 + i,
            kind="mcp_tool_call",
            body={"call": f"c{i}", "tool": "mcp:time:get_time", "result": "sha256:" + "ab" * 32},
            prev="cd" * 32,
        )

    def without_tree() -> None:
        for _ in range(sample):
            seal_one()

    def with_tree() -> None:
        for _ in range(sample):
            tree.append_leaf(leaf_hash(seal_one().raw))

    plain: list[float] = []
    merkle: list[float] = []
    # The in-memory tree keeps 2M small objects alive; a cyclic-GC pass over them would be billed
    # to whichever variant allocates when it triggers. The store keeps nodes in SQLite, so the
    # collector is held off for both variants, and their order alternates.
    gc.collect()
    gc.disable()
    for r in range(rounds):
        if r % 2:
            merkle.append(_median_time(with_tree, 1) / sample)
            plain.append(_median_time(without_tree, 1) / sample)
        else:
            plain.append(_median_time(without_tree, 1) / sample)
            merkle.append(_median_time(with_tree, 1) / sample)
    gc.enable()
    plain_us, merkle_us = statistics.median(plain) * 1e6, statistics.median(merkle) * 1e6
    print(
        f"append (interleaved rounds): {merkle_us:.1f} us with the incremental tree vs {plain_us:.1f} us without "
        f"-> ratio {merkle_us / plain_us:.3f}"
    )
    # The same question asked by parts, less exposed to a noisy machine: the tree's own cost per
    # append (leaf hash, frontier, node lists) over the cost of sealing an entry.
    raws = [seal_one().raw for _ in range(sample)]

    def tree_only() -> None:
        for raw in raws:
            tree.append_leaf(leaf_hash(raw))

    gc.disable()
    tree_us = statistics.median(_median_time(tree_only, 1) / sample for _ in range(rounds)) * 1e6
    gc.enable()
    print(
        f"append (by parts): tree update {tree_us:.2f} us + sealing {plain_us:.1f} us "
        f"-> ratio {(plain_us + tree_us) / plain_us:.3f}"
    )
    leaves = tree.levels[0][:n]

    def full_root() -> bytes:
        level = leaves
        while len(level) > 1:
            # RFC 6962's left-balanced tree equals pairing left to right and carrying the odd one up.
            nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]

    assert full_root() == root_at(n, tree.get_node)
    recompute_s = _median_time(full_root, 1)
    print(
        f"append without an incremental tree would recompute the root: {recompute_s * 1e3:.0f} ms per append "
        f"-> ratio {recompute_s * 1e6 / plain_us:,.0f}x a plain append"
    )

    # 2. checkpoint: root from stored nodes + signing the note, vs signing one entry.
    size = tree.frontier.size

    def checkpoint() -> None:
        root = root_at(size, tree.get_node)
        sign_checkpoint_note(ORIGIN, size, root, key)

    cp_s = _median_time(checkpoint, rounds * 10)
    sign_s = _median_time(seal_one, rounds * 10)
    print(
        f"checkpoint at {size:,}: {cp_s * 1e6:.0f} us vs sealing one entry {sign_s * 1e6:.0f} us "
        f"-> ratio {cp_s / sign_s:.2f}"
    )

    # 3. inclusion proofs at random leaves of the full tree.
    rng = random.Random(7)
    root = tree.frontier.root()
    targets = [rng.randrange(size) for _ in range(1000)]
    proof_times: list[float] = []
    verify_times: list[float] = []
    gc.collect()
    gc.disable()  # a collection of the 2M-node tree would land inside one sample
    for index in targets:
        t0 = time.perf_counter()
        proof = inclusion_proof(index, size, tree.get_node)
        t1 = time.perf_counter()
        ok = verify_inclusion(tree.get_node(0, index), index, size, proof, root)
        t2 = time.perf_counter()
        assert ok
        proof_times.append(t1 - t0)
        verify_times.append(t2 - t1)
    gc.enable()
    p50, p99 = statistics.median(proof_times), sorted(proof_times)[int(len(proof_times) * 0.99)]
    print(
        f"inclusion proof at {size:,}: median {p50 * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us (target < 1000 us); "
        f"verify median {statistics.median(verify_times) * 1e6:.1f} us -> ratio proof/target {p50 / 1e-3:.3f}"
    )

    # 4. a 100-entry session's bundle, exported from the 1M-entry log, verified offline.
    source = _Source(tree, entries, key)
    head_cp = sign_checkpoint_note(ORIGIN, n, root_at(n, tree.get_node), key)
    assert head_cp.note is not None
    source.add_checkpoint(n, head_cp.root, head_cp.note.decode())
    envelope = sign_verdict(
        verdict_statement(
            session=SESSION,
            head=entries[-1].hash,
            status="pass",
            checks=[],
            contract_hash="sha256:" + "0" * 64,
            checkpoint=head_cp.note.decode(),
        ),
        key,
    )
    source._envelope = envelope.to_bytes()
    bundle = export_bundle(source, SESSION, vkey=key.verifier.vkey)
    report = verify_bundle(bundle, trusted)
    assert report.ok, report.message
    bundle_s = _median_time(lambda: verify_bundle(bundle, trusted), rounds)
    chain_s = _median_time(lambda: verify_entries(entries, trusted, session=SESSION), rounds)
    print(
        f"bundle of {session_len} entries ({len(bundle) / 1024:.0f} KiB) at {n:,}: verify {bundle_s * 1e3:.1f} ms "
        f"vs the chain alone {chain_s * 1e3:.1f} ms -> ratio {bundle_s / chain_s:.2f}"
    )


if __name__ == "__main__":
    main()
