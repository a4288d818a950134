"""The Merkle log: known answers, and every proof checked against the RFC 9162 text run naively."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss.ledger.merkle import (
    EMPTY_ROOT,
    Frontier,
    GetNode,
    LeafProver,
    MemoryTree,
    consistency_nodes,
    consistency_proof,
    fetched,
    in_order,
    inclusion_nodes,
    inclusion_proof,
    inclusion_root,
    leaf_hash,
    leaves_nodes,
    node_hash,
    path_nodes,
    root_at,
    root_nodes,
    root_with_leaves,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).parent / "vectors" / "merkle"


# -- the reference: RFC 9162 section 2.1, recursive, over whole lists of leaf hashes ----------


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(leaves: list[bytes]) -> bytes:
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = _k(n)
    return node_hash(ref_mth(leaves[:k]), ref_mth(leaves[k:]))


def ref_path(m: int, leaves: list[bytes]) -> list[bytes]:
    n = len(leaves)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return [*ref_path(m, leaves[:k]), ref_mth(leaves[k:])]
    return [*ref_path(m - k, leaves[k:]), ref_mth(leaves[:k])]


def ref_subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if b else [ref_mth(leaves)]
    k = _k(n)
    if m <= k:
        return [*ref_subproof(m, leaves[:k], b), ref_mth(leaves[k:])]
    return [*ref_subproof(m - k, leaves[k:], False), ref_mth(leaves[:k])]


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(i.to_bytes(4, "big")) for i in range(n)]


def _tree(n: int) -> MemoryTree:
    tree = MemoryTree()
    for i in range(n):
        tree.append(i.to_bytes(4, "big"))
    return tree


def _flip(h: bytes) -> bytes:
    return bytes([h[0] ^ 1]) + h[1:]


# -- known answers --------------------------------------------------------------------------


def _vectors() -> dict[str, Any]:
    return json.loads((VECTORS / "rfc6962_ct_reference.json").read_text())


def test_empty_tree_root_is_the_rfc6962_empty_hash() -> None:
    data = _vectors()
    assert EMPTY_ROOT.hex() == data["empty_root"]
    assert Frontier().root() == EMPTY_ROOT
    assert root_at(0, MemoryTree().get_node) == EMPTY_ROOT


def test_roots_match_the_certificate_transparency_reference_tree() -> None:
    data = _vectors()
    tree = MemoryTree()
    assert tree.root().hex() == data["roots"][0]
    for n, leaf in enumerate(data["leaves"], start=1):
        tree.append(bytes.fromhex(leaf))
        assert tree.root().hex() == data["roots"][n]
    for n in range(len(data["roots"])):
        assert tree.root(n).hex() == data["roots"][n]


def test_reference_proofs_are_produced_and_verified() -> None:
    data = _vectors()
    tree = MemoryTree()
    for leaf in data["leaves"]:
        tree.append(bytes.fromhex(leaf))
    for case in data["inclusion"]:
        proof = [bytes.fromhex(h) for h in case["proof"]]
        assert tree.inclusion_proof(case["index"], case["size"]) == proof
        leaf = leaf_hash(bytes.fromhex(data["leaves"][case["index"]]))
        root = bytes.fromhex(data["roots"][case["size"]])
        assert verify_inclusion(leaf, case["index"], case["size"], proof, root)
    for case in data["consistency"]:
        proof = [bytes.fromhex(h) for h in case["proof"]]
        assert tree.consistency_proof(case["old"], case["new"]) == proof
        old_root, new_root = bytes.fromhex(data["roots"][case["old"]]), bytes.fromhex(data["roots"][case["new"]])
        assert verify_consistency(case["old"], case["new"], old_root, new_root, proof)


# -- the incremental tree -------------------------------------------------------------------


def test_frontier_root_equals_the_recursive_root_at_every_size() -> None:
    leaves = _leaves(300)
    frontier = Frontier()
    for n, leaf in enumerate(leaves, start=1):
        frontier.append(leaf)
        assert frontier.size == n
        assert frontier.root() == ref_mth(leaves[:n])


def test_append_reports_the_leaf_first_then_each_completed_parent() -> None:
    frontier = Frontier()
    leaves = _leaves(8)
    completed = [frontier.append(leaf) for leaf in leaves]
    assert completed[0] == [(0, 0, leaves[0])]
    assert [(level, index) for level, index, _ in completed[7]] == [(0, 7), (1, 3), (2, 1), (3, 0)]
    assert completed[7][-1][2] == ref_mth(leaves)


def test_frontier_state_round_trips_and_appending_continues() -> None:
    leaves = _leaves(77)
    frontier = Frontier()
    for leaf in leaves[:50]:
        frontier.append(leaf)
    resumed = Frontier.from_state(frontier.to_state())
    assert resumed.size == 50 and resumed.root() == frontier.root()
    for leaf in leaves[50:]:
        resumed.append(leaf)
    assert resumed.root() == ref_mth(leaves)


def test_frontier_rebuilt_from_stored_nodes_continues_the_same_tree() -> None:
    tree = _tree(45)
    rebuilt = Frontier.at(37, tree.get_node)
    for leaf in _leaves(45)[37:]:
        rebuilt.append(leaf)
    assert rebuilt.root() == tree.root()


@pytest.mark.parametrize(
    "state",
    [b"", b"\x02" + bytes(8), b"\x01" + (3).to_bytes(8, "big") + bytes(32), b"\x01" + (1).to_bytes(8, "big")],
    ids=["empty", "unknown_version", "too_few_hashes", "missing_hash"],
)
def test_malformed_frontier_state_is_refused(state: bytes) -> None:
    with pytest.raises(ValueError):
        Frontier.from_state(state)


def test_a_leaf_that_is_not_a_hash_is_refused() -> None:
    with pytest.raises(ValueError):
        Frontier().append(b"entry bytes, not their hash")


def test_every_stored_node_is_the_hash_of_the_leaves_it_covers() -> None:
    tree = _tree(100)
    leaves = _leaves(100)
    for (level, index), value in tree.nodes.items():
        assert value == ref_mth(leaves[index << level : (index + 1) << level])
    assert len(tree.nodes) == 2 * 100 - (100).bit_count()


# -- inclusion -------------------------------------------------------------------------------


def test_inclusion_proofs_verify_for_every_index_and_size_up_to_300() -> None:
    tree = _tree(300)
    leaves = _leaves(300)
    roots = [tree.root(n) for n in range(301)]
    for size in range(1, 301):
        assert roots[size] == ref_mth(leaves[:size])
        for index in range(size):
            proof = inclusion_proof(index, size, tree.get_node)
            assert verify_inclusion(leaves[index], index, size, proof, roots[size])
            # Spot-check the naive recursion on a lattice; it is quadratic in the size.
            if size % 37 == 0 or size < 40:
                assert proof == ref_path(index, leaves[:size])


@pytest.mark.slow
def test_inclusion_fails_for_any_changed_hash_index_or_size() -> None:
    tree = _tree(301)
    leaves = _leaves(301)
    roots = [tree.root(n) for n in range(302)]
    for size in range(1, 301):
        root = roots[size]
        for index in range(size):
            proof = inclusion_proof(index, size, tree.get_node)
            leaf = leaf_hash(index.to_bytes(4, "big"))
            assert leaf == leaves[index]
            # Every position of the proof up to size 64; beyond, one position per case, rotating.
            positions = range(len(proof)) if size <= 64 else [(index + size) % len(proof)] if proof else []
            for i in positions:
                changed = [*proof[:i], _flip(proof[i]), *proof[i + 1 :]]
                assert not verify_inclusion(leaf, index, size, changed, root)
            assert not verify_inclusion(_flip(leaf), index, size, proof, root)
            assert not verify_inclusion(leaf, index, size, proof, _flip(root))
            for other in {index - 1, index + 1, index ^ 2} - {index}:
                if 0 <= other < size:
                    assert not verify_inclusion(leaf, other, size, proof, root)
            # A size is only meaningful with its root: the checkpoint signs the two together.
            for other_size in (size - 1, size + 1):
                if other_size > index:
                    assert not verify_inclusion(leaf, index, other_size, proof, roots[other_size])
            assert not verify_inclusion(leaf, index, size, [*proof, proof[0] if proof else leaf], root)
            if proof:
                assert not verify_inclusion(leaf, index, size, proof[:-1], root)


def test_a_proof_folded_as_its_nodes_arrive_agrees_with_verify_inclusion_for_every_index_and_size_up_to_300() -> None:
    tree = _tree(300)
    leaves = _leaves(300)
    for size in range(1, 301):
        root = tree.root(size)
        for index in range(size):
            keys = list(path_nodes(index, size))
            assert sorted(keys) == sorted(inclusion_nodes(index, size)), "the same subtrees, one at a time"
            hashes = [tree.nodes[key] for key in keys]
            assert inclusion_root(leaves[index], index, size, iter(hashes)) == root
            assert inclusion_root(_flip(leaves[index]), index, size, hashes) != root
            for i in range(len(hashes)) if size <= 64 else [(index + size) % len(hashes)] if hashes else []:
                changed = dict(zip(keys, hashes, strict=True))
                changed[keys[i]] = _flip(hashes[i])
                assert inclusion_root(leaves[index], index, size, [changed[key] for key in keys]) != root
                if size <= 64:
                    proof = inclusion_proof(index, size, lambda level, at, nodes=changed: nodes[(level, at)])
                    assert not verify_inclusion(leaves[index], index, size, proof, root), "both refuse the same nodes"


def test_a_folded_proof_with_a_missing_extra_or_malformed_hash_gives_no_root() -> None:
    tree = _tree(13)
    leaf = tree.nodes[(0, 6)]
    hashes = [tree.nodes[key] for key in path_nodes(6, 13)]
    assert inclusion_root(leaf, 6, 13, hashes) == tree.root(13)
    assert inclusion_root(leaf, 6, 13, hashes[:-1]) is None
    assert inclusion_root(leaf, 6, 13, [*hashes, hashes[0]]) is None
    assert inclusion_root(leaf, 6, 13, [*hashes[:-1], hashes[-1][:31]]) is None
    assert inclusion_root(leaf[:31], 6, 13, hashes) is None
    assert inclusion_root(leaf, 0, 1, []) == leaf, "a tree of one leaf is its leaf"
    with pytest.raises(ValueError):
        list(path_nodes(13, 13))


def _counting(
    tree: MemoryTree, changed: dict[tuple[int, int], bytes] | None = None
) -> tuple[Any, list[list[tuple[int, int]]]]:
    """A ``NodeHashes`` over ``tree`` (with ``changed`` nodes swapped in) and the keys of each lookup."""
    asked: list[list[tuple[int, int]]] = []

    def hashes(keys: Any) -> list[bytes]:
        keys = list(keys)
        asked.append(keys)
        return [(changed or {}).get(key, tree.nodes[key]) for key in keys]

    return hashes, asked


@given(st.integers(1, 200), st.data())
def test_a_leaf_prover_answers_what_a_whole_folded_proof_answers_for_any_leaves_in_any_order(
    size: int, data: st.DataObject
) -> None:
    tree = _tree(size)
    leaves = _leaves(size)
    root = tree.root(size)
    prover = LeafProver(size, root)
    hashes, _ = _counting(tree)
    for _ in range(data.draw(st.integers(1, 40))):
        index = data.draw(st.integers(0, size - 1))
        leaf = leaves[index] if data.draw(st.booleans()) else _flip(leaves[data.draw(st.integers(0, size - 1))])
        whole = inclusion_root(leaf, index, size, hashes(path_nodes(index, size))) == root
        assert prover.prove(leaf, index, hashes) == whole


def test_a_leaf_prover_reads_about_two_nodes_a_leaf_for_adjacent_leaves_in_a_large_tree() -> None:
    tree = _tree(20_000)
    leaves = _leaves(20_000)
    prover = LeafProver(20_000, tree.root())
    hashes, asked = _counting(tree)
    assert all(prover.prove(leaves[i], i, hashes) for i in range(5_000, 5_512))
    assert asked[0] == list(path_nodes(5_000, 20_000)), "the first leaf reads its whole path"
    read = sum(len(keys) for keys in asked[1:])
    assert read <= 2 * 511 + 4 * 15, "the part below what is known: 2 a leaf, and a whole path per 256 leaves"


@pytest.mark.parametrize("first", [0, 7, 12])
def test_after_a_neighbour_proved_a_changed_node_refuses_every_wrong_leaf_and_the_right_one_if_it_is_read(
    first: int,
) -> None:
    tree = _tree(13)
    leaves = _leaves(13)
    root = tree.root(13)
    for index in range(13):
        for key in path_nodes(index, 13):
            prover = LeafProver(13, root)
            assert prover.prove(leaves[first], first, _counting(tree)[0])
            changed, asked = _counting(tree, {key: _flip(tree.nodes[key])})
            for other in range(13):
                if other != index:
                    assert not prover.prove(leaves[other], index, changed), "a wrong leaf never proves"
            assert prover.prove(leaves[index], index, changed) == (key not in asked[-1]), (
                "the right leaf proves only when the changed node is above what the neighbour's proof authenticated"
            )


def test_a_failed_proof_teaches_a_leaf_prover_nothing() -> None:
    tree = _tree(64)
    leaves = _leaves(64)
    prover = LeafProver(64, tree.root())
    hashes, _ = _counting(tree)
    forged = {key: _flip(tree.nodes[key]) for key in path_nodes(9, 64)}
    assert not prover.prove(_flip(leaves[8]), 8, _counting(tree, forged)[0])
    assert not prover.prove(_flip(leaves[8]), 8, hashes), "the forged subtrees were not kept"
    assert prover.prove(leaves[8], 8, hashes)
    assert not prover.prove(_flip(leaves[9]), 9, hashes)
    assert not prover.prove(leaves[9], 9, _counting(tree, {(0, 8): _flip(leaves[8])})[0])
    assert prover.prove(leaves[9], 9, hashes)


def test_a_leaf_prover_holds_a_few_hashes_of_one_path_and_refuses_what_is_not_a_leaf_of_the_tree() -> None:
    tree = _tree(4_096)
    leaves = _leaves(4_096)
    prover = LeafProver(4_096, tree.root())
    hashes, _ = _counting(tree)
    for index in range(0, 4_096, 37):  # far apart: each proof adds most of a path
        assert prover.prove(leaves[index], index, hashes)
        assert not prover.prove(_flip(leaves[index]), index, hashes)
        assert len(prover._path) <= 9  # pyright: ignore[reportPrivateUsage] - the lowest subtrees and the root
    with pytest.raises(ValueError):
        prover.prove(leaves[0], 4_096, hashes)
    assert not prover.prove(leaves[0][:31], 0, hashes)
    assert not prover.prove(leaves[1], 1, lambda keys: [tree.nodes[k] for k in keys][:-1])


def test_hashes_in_order_over_a_mapping_lookup_are_one_lookup_in_the_order_asked() -> None:
    tree = _tree(20_000)
    lookups: list[Sequence[tuple[int, int]]] = []

    def get_nodes(keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        lookups.append(keys)
        return tree.get_nodes(keys)

    keys = list(path_nodes(28, 20_000))
    assert list(in_order(get_nodes)(iter(keys))) == [tree.nodes[key] for key in keys]
    assert len(lookups) == 1
    assert inclusion_root(tree.nodes[(0, 28)], 28, 20_000, in_order(get_nodes)(path_nodes(28, 20_000))) == tree.root()
    assert list(in_order(get_nodes)([])) == [] and len(lookups) == 2


def test_inclusion_outside_the_tree_is_refused() -> None:
    tree = _tree(5)
    with pytest.raises(ValueError):
        inclusion_proof(5, 5, tree.get_node)
    assert not verify_inclusion(leaf_hash(b"x"), 5, 5, [], tree.root())
    assert not verify_inclusion(leaf_hash(b"x"), 0, 0, [], EMPTY_ROOT)


def test_malformed_proof_hashes_do_not_verify() -> None:
    tree = _tree(8)
    proof = tree.inclusion_proof(3)
    short = [*proof[:-1], proof[-1][:31]]
    assert not verify_inclusion(leaf_hash((3).to_bytes(4, "big")), 3, 8, short, tree.root())
    assert not verify_inclusion(leaf_hash((3).to_bytes(4, "big")), 3, 8, [proof[0]] * 65, tree.root())


# -- consistency -----------------------------------------------------------------------------


def test_consistency_proofs_match_the_rfc_and_verify_for_every_pair_up_to_80() -> None:
    tree = _tree(80)
    leaves = _leaves(80)
    roots = [tree.root(n) for n in range(81)]
    for new in range(0, 81):
        for old in range(0, new + 1):
            proof = consistency_proof(old, new, tree.get_node)
            expected = [] if old in (0, new) else ref_subproof(old, leaves[:new], True)
            assert proof == expected, (old, new)
            assert verify_consistency(old, new, roots[old], roots[new], proof)


def test_consistency_fails_for_any_changed_hash_or_size() -> None:
    tree = _tree(80)
    roots = [tree.root(n) for n in range(81)]
    for new in range(1, 81):
        for old in range(1, new):
            proof = consistency_proof(old, new, tree.get_node)
            for i in range(len(proof)):
                changed = [*proof[:i], _flip(proof[i]), *proof[i + 1 :]]
                assert not verify_consistency(old, new, roots[old], roots[new], changed)
            assert not verify_consistency(old, new, _flip(roots[old]), roots[new], proof)
            assert not verify_consistency(old, new, roots[old], _flip(roots[new]), proof)
            assert not verify_consistency(old, new, roots[old], roots[new], proof[:-1])
            assert not verify_consistency(old, new, roots[old], roots[new], [*proof, proof[-1]])
            for other_old in (old - 1, old + 1):
                if 0 < other_old < new:
                    assert not verify_consistency(other_old, new, roots[other_old], roots[new], proof)
            for other_new in (new - 1, new + 1):
                if old < other_new <= 80:
                    assert not verify_consistency(old, other_new, roots[old], roots[other_new], proof)


def test_a_fork_at_the_same_size_is_not_consistent() -> None:
    tree = _tree(20)
    fork = MemoryTree()
    for i in range(20):
        fork.append((i if i != 11 else 999).to_bytes(4, "big"))
    assert not verify_consistency(20, 20, tree.root(), fork.root(), [])
    proof = fork.consistency_proof(12, 20)
    assert not verify_consistency(12, 20, tree.root(12), fork.root(), proof)


def test_consistency_edge_sizes() -> None:
    tree = _tree(9)
    assert verify_consistency(0, 9, EMPTY_ROOT, tree.root(), [])
    assert not verify_consistency(0, 9, tree.root(), tree.root(), [])
    assert not verify_consistency(9, 5, tree.root(), tree.root(5), [])
    assert not verify_consistency(5, 9, tree.root(5), tree.root(), [])
    with pytest.raises(ValueError):
        consistency_proof(9, 5, tree.get_node)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=64), st.data())
def test_any_entries_prove_inclusion_and_extend_every_earlier_tree(entries: list[bytes], data: st.DataObject) -> None:
    tree = MemoryTree()
    for entry in entries:
        tree.append(entry)
    size = tree.size
    index = data.draw(st.integers(0, size - 1))
    assert verify_inclusion(leaf_hash(entries[index]), index, size, tree.inclusion_proof(index), tree.root())
    old = data.draw(st.integers(0, size))
    assert verify_consistency(old, size, tree.root(old), tree.root(), tree.consistency_proof(old))


@given(st.integers(1, 80), st.data())
def test_a_root_recomputed_from_any_known_leaves_is_the_tree_root_and_a_changed_leaf_is_not(
    size: int, data: st.DataObject
) -> None:
    tree = _tree(size)
    leaves = _leaves(size)
    known = data.draw(st.sets(st.integers(0, size - 1)))
    given_leaves = {index: leaves[index] for index in known}
    assert root_with_leaves(given_leaves, size, tree.get_node) == tree.root(size) == ref_mth(leaves)
    if known:
        changed = data.draw(st.sampled_from(sorted(known)))
        assert root_with_leaves({**given_leaves, changed: _flip(leaves[changed])}, size, tree.get_node) != tree.root()


def test_a_root_from_adjacent_leaves_reads_only_the_subtrees_beside_them() -> None:
    tree = _tree(1000)
    reads: list[tuple[int, int]] = []

    def get_node(level: int, index: int) -> bytes:
        reads.append((level, index))
        return tree.get_node(level, index)

    leaves = _leaves(1000)
    assert root_with_leaves({i: leaves[i] for i in range(300, 700)}, 1000, get_node) == tree.root()
    assert len(reads) <= 2 * 10  # O(log n) stored subtrees, not one proof (~10 nodes) per leaf


def test_a_known_leaf_outside_the_tree_is_refused() -> None:
    with pytest.raises(ValueError):
        root_with_leaves({5: _leaves(6)[5]}, 5, _tree(5).get_node)


@given(st.integers(1, 300), st.data())
def test_each_node_plan_names_exactly_the_stored_subtrees_its_computation_reads(size: int, data: st.DataObject) -> None:
    tree = _tree(size)
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(0, size))
    known = data.draw(st.sets(st.integers(0, size - 1), max_size=20))
    leaves = _leaves(size)
    cases: list[tuple[list[tuple[int, int]], Callable[[GetNode], object]]] = [
        (root_nodes(size), lambda node: root_at(size, node)),
        (inclusion_nodes(index, size), lambda node: inclusion_proof(index, size, node)),
        (consistency_nodes(old, size), lambda node: consistency_proof(old, size, node)),
        (leaves_nodes(known, size), lambda node: root_with_leaves({i: leaves[i] for i in known}, size, node)),
    ]
    for plan, compute in cases:
        reads: list[tuple[int, int]] = []

        def recording(level: int, at: int, reads: list[tuple[int, int]] = reads) -> bytes:
            reads.append((level, at))
            return tree.get_node(level, at)

        expected = compute(recording)
        assert sorted(set(reads)) == sorted(set(plan)), "the plan is what the computation reads"
        lookups: list[Sequence[tuple[int, int]]] = []

        def get_nodes(
            keys: Sequence[tuple[int, int]], lookups: list[Sequence[tuple[int, int]]] = lookups
        ) -> dict[tuple[int, int], bytes]:
            lookups.append(keys)
            return tree.get_nodes(keys)

        assert compute(fetched(get_nodes, plan)) == expected, "served from one lookup, the same result"
        assert len(lookups) == (1 if plan else 0)


def test_a_proof_in_a_large_tree_is_one_lookup_of_its_log2_nodes() -> None:
    tree = _tree(20_000)
    lookups: list[Sequence[tuple[int, int]]] = []

    def get_nodes(keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        lookups.append(keys)
        return tree.get_nodes(keys)

    proof = inclusion_proof(28, 20_000, fetched(get_nodes, inclusion_nodes(28, 20_000)))
    assert verify_inclusion(tree.get_node(0, 28), 28, 20_000, proof, tree.root())
    assert len(lookups) == 1 and len(lookups[0]) >= len(proof) > 10
