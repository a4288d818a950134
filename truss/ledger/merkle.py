"""RFC 6962 / RFC 9162 Merkle tree hashing: the incremental tree, roots, proofs and their checks.

The ledger is one Merkle tree whose leaf ``i`` is the canonical bytes of the entry with
``index == i``. This module is sans-IO: it never reads or writes storage. Instead:

- ``Frontier`` is the compact right edge of the tree over ``[0, size)``: one hash per set bit of
  ``size``. ``append`` costs O(log n) and returns every subtree it completes, so a store can keep
  them (``(level, index) -> hash``, where the node covers leaves ``[index * 2**level,
  (index + 1) * 2**level)``). A stored frontier (``to_state``) lets a store resume appending
  without reading the tree.
- ``root_at``, ``inclusion_proof`` and ``consistency_proof`` read only *complete* subtrees
  through a ``GetNode`` callback, O(log n) lookups each, for any size up to the current one;
  ``root_with_leaves`` is the root recomputed from many known leaves at once (a multi-leaf proof).
- ``root_nodes``, ``inclusion_nodes``, ``consistency_nodes`` and ``leaves_nodes`` name the stored
  subtrees the matching computation reads, from sizes and indices alone (no hash decides which
  node is read next), so a store fetches them all in one lookup (``GetNodes``) and ``fetched``
  serves them to the computation: one query per proof, or per batch of proofs, instead of one per node.
- ``path_nodes`` names the same subtrees as ``inclusion_nodes`` one at a time, in the order
  ``inclusion_root`` folds them, so a store can stream their hashes (``NodeHashes``) into the check
  and a proof's memory does not grow with the log.
- ``verify_inclusion`` and ``verify_consistency`` are the RFC 9162 section 2.1.3.2 / 2.1.4.2
  algorithms over hashes alone; they return ``False`` on any malformed input rather than raising.

Hashes: ``leaf_hash(b) = SHA-256(0x00 || b)``, ``node_hash(l, r) = SHA-256(0x01 || l || r)``,
and the empty tree's root is ``SHA-256("")``. What this module does not do: decide which bytes are
a leaf (the entry module does), sign anything (``note``), or persist nodes (``store``).

Precondition violations by a caller (a proof for an index outside the tree, a malformed frontier
state) raise ``ValueError``; they are programming errors, not untrusted input.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "Frontier",
    "GetNode",
    "GetNodes",
    "LeafProver",
    "MemoryTree",
    "NodeHashes",
    "NodeKey",
    "consistency_nodes",
    "consistency_proof",
    "fetched",
    "in_order",
    "inclusion_nodes",
    "inclusion_proof",
    "inclusion_root",
    "leaf_hash",
    "leaves_nodes",
    "node_hash",
    "path_nodes",
    "root_at",
    "root_nodes",
    "root_with_leaves",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT: bytes = hashlib.sha256(b"").digest()

# A proof longer than this cannot belong to a tree of at most 2**64 leaves.
_MAX_PROOF_LEN = 64
_STATE_VERSION = 1

GetNode = Callable[[int, int], bytes]
"""``(level, index)`` of a complete subtree -> its 32-byte hash."""

NodeKey = tuple[int, int]
"""``(level, index)`` of a complete subtree."""

GetNodes = Callable[[Sequence[NodeKey]], Mapping[NodeKey, bytes]]
"""Many complete subtrees -> their hashes, in one lookup (a store's ``nodes``); it raises rather
than leave one out."""

NodeHashes = Callable[[Iterable[NodeKey]], Iterable[bytes]]
"""Many complete subtrees -> their hashes in the order asked, streamed (a store's ``node_hashes``), for a
fold that holds none of them (``inclusion_root``); it raises rather than skip one."""


def leaf_hash(entry_bytes: bytes) -> bytes:
    """``SHA-256(0x00 || entry_bytes)``: the RFC 6962 leaf hash."""
    return hashlib.sha256(b"\x00" + entry_bytes).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: the RFC 6962 interior node hash."""
    return hashlib.sha256(b"\x01" + left + right).digest()


class Frontier:
    """The right edge of the tree over ``[0, size)``: the roots of its maximal perfect subtrees.

    ``_hashes[i]`` is the subtree at ``_levels[i]``; levels strictly decrease left to right and
    are exactly the set bits of ``size``.
    """

    __slots__ = ("_hashes", "_levels", "size")

    def __init__(self) -> None:
        self.size = 0
        self._levels: list[int] = []
        self._hashes: list[bytes] = []

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add the leaf *hash* ``leaf`` (see ``leaf_hash``) at index ``size``.

        Returns the subtrees this append completes as ``(level, index, hash)``, the leaf itself
        first, then each parent up to the largest; a store keeps them all for ``GetNode``.
        """
        if len(leaf) != HASH_SIZE:
            raise ValueError(f"a leaf hash is {HASH_SIZE} bytes, got {len(leaf)}")
        index = self.size
        completed = [(0, index, leaf)]
        level, current = 0, leaf
        while self._levels and self._levels[-1] == level:
            self._levels.pop()
            left = self._hashes.pop()
            current = node_hash(left, current)
            level += 1
            completed.append((level, index >> level, current))
        self._levels.append(level)
        self._hashes.append(current)
        self.size += 1
        return completed

    def root(self) -> bytes:
        """The Merkle tree hash of ``[0, size)``."""
        if not self._hashes:
            return EMPTY_ROOT
        acc = self._hashes[-1]
        for left in reversed(self._hashes[:-1]):
            acc = node_hash(left, acc)
        return acc

    def to_state(self) -> bytes:
        """Bytes a store keeps to resume appending: version, size (8 bytes BE), then the hashes."""
        return bytes([_STATE_VERSION]) + self.size.to_bytes(8, "big") + b"".join(self._hashes)

    @classmethod
    def from_state(cls, data: bytes) -> Frontier:
        """The inverse of ``to_state``; refuses bytes that do not describe a frontier."""
        if len(data) < 9 or data[0] != _STATE_VERSION:
            raise ValueError("not a Merkle frontier state (bad version or length)")
        size = int.from_bytes(data[1:9], "big")
        levels = [bit for bit in range(64, -1, -1) if size >> bit & 1]
        body = data[9:]
        if len(body) != HASH_SIZE * len(levels):
            raise ValueError(f"a frontier of size {size} holds {len(levels)} hashes, the state has {len(body)} bytes")
        frontier = cls()
        frontier.size = size
        frontier._levels = levels
        frontier._hashes = [body[i * HASH_SIZE : (i + 1) * HASH_SIZE] for i in range(len(levels))]
        return frontier

    @classmethod
    def at(cls, size: int, get_node: GetNode) -> Frontier:
        """The frontier of the tree of ``size`` leaves, rebuilt from stored subtrees."""
        if size < 0:
            raise ValueError("a tree size is never negative")
        frontier = cls()
        frontier.size = size
        for level, index in _perfect_cover(0, size):
            frontier._levels.append(level)
            frontier._hashes.append(get_node(level, index))
        return frontier


def _largest_power_of_two_below(n: int) -> int:
    """The largest power of two strictly less than ``n`` (``n >= 2``): RFC 9162's ``k``."""
    return 1 << ((n - 1).bit_length() - 1)


def _perfect_cover(start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` as perfect subtrees ``(level, index)``, left to right, largest first.

    ``start`` is aligned to every subtree used (it is 0 or a multiple of a power of two at least
    ``end - start``), which holds for every range the RFC 9162 recursions visit.
    """
    out: list[tuple[int, int]] = []
    pos, width = start, end - start
    while width:  # one step a set bit of the width, the largest first
        level = width.bit_length() - 1
        out.append((level, pos >> level))
        pos += 1 << level
        width -= 1 << level
    return out


def _range_hash(start: int, end: int, get_node: GetNode) -> bytes:
    """MTH(D[start:end]) from stored perfect subtrees (O(log n) lookups)."""
    if start == end:
        return EMPTY_ROOT
    hashes = [get_node(level, index) for level, index in _perfect_cover(start, end)]
    acc = hashes[-1]
    for left in reversed(hashes[:-1]):
        acc = node_hash(left, acc)
    return acc


def fetched(get_nodes: GetNodes, *plans: Iterable[NodeKey]) -> GetNode:
    """A ``GetNode`` over the nodes ``plans`` name (``inclusion_nodes`` ...), read in one ``get_nodes`` call.

    Give it to the computations those plans were made for; asking it for another node is a
    programming error (``KeyError``).
    """
    keys = list(dict.fromkeys(key for plan in plans for key in plan))
    found: Mapping[NodeKey, bytes] = get_nodes(keys) if keys else {}
    return lambda level, index: found[(level, index)]


def in_order(get_nodes: GetNodes) -> NodeHashes:
    """A ``NodeHashes`` over a store that only has ``nodes`` (a mapping): one lookup, then its values in order."""

    def hashes(keys: Iterable[NodeKey]) -> Iterator[bytes]:
        wanted = list(keys)
        found: Mapping[NodeKey, bytes] = get_nodes(wanted) if wanted else {}
        return (found[key] for key in wanted)

    return hashes


def _covers(ranges: Iterable[tuple[int, int]]) -> list[NodeKey]:
    return [key for start, end in ranges for key in _perfect_cover(start, end)]


def root_nodes(size: int) -> list[NodeKey]:
    """The stored subtrees ``root_at(size)`` reads."""
    if size < 0:
        raise ValueError("a tree size is never negative")
    return _perfect_cover(0, size)


def root_at(size: int, get_node: GetNode) -> bytes:
    """The root of the tree over the first ``size`` leaves (any size up to the stored one)."""
    if size < 0:
        raise ValueError("a tree size is never negative")
    return _range_hash(0, size, get_node)


def root_with_leaves(leaves: Mapping[int, bytes], size: int, get_node: GetNode) -> bytes:
    """MTH(D[0:size]) computed from the leaf *hashes* ``leaves`` (index -> hash) where given and
    from stored complete subtrees only where no given leaf lies: a multi-leaf inclusion proof.

    It equals a signed root of ``size`` only if every given leaf is the leaf at its index (the
    subtrees read through ``get_node`` play the part of an RFC 9162 inclusion proof's siblings,
    shared by all the leaves). For ``k`` adjacent leaves it costs about ``2k`` hashes and
    O(log n) lookups, where one proof per leaf costs ``k * log n`` lookups.
    """
    indices = _leaf_indices(leaves, size)

    def mth(start: int, end: int, lo: int, hi: int) -> bytes:  # indices[lo:hi] lie in [start, end)
        if lo == hi:
            return _range_hash(start, end, get_node)
        if end - start == 1:
            return leaves[start]
        k = _largest_power_of_two_below(end - start)
        mid = bisect_left(indices, start + k, lo, hi)
        return node_hash(mth(start, start + k, lo, mid), mth(start + k, end, mid, hi))

    return mth(0, size, 0, len(indices)) if size else EMPTY_ROOT


def _leaf_indices(leaves: Iterable[int], size: int) -> list[int]:
    indices = sorted(leaves)
    if indices and (indices[0] < 0 or indices[-1] >= size):
        raise ValueError(f"leaves {indices[0]}..{indices[-1]} are not all in a tree of size {size}")
    return indices


def leaves_nodes(leaves: Iterable[int], size: int) -> list[NodeKey]:
    """The stored subtrees ``root_with_leaves`` reads when given the leaves at ``leaves``."""
    indices = _leaf_indices(leaves, size)
    gaps: list[tuple[int, int]] = []

    def walk(start: int, end: int, lo: int, hi: int) -> None:  # mth's recursion, without the hashing
        if lo == hi:
            gaps.append((start, end))
        elif end - start > 1:
            k = _largest_power_of_two_below(end - start)
            mid = bisect_left(indices, start + k, lo, hi)
            walk(start, start + k, lo, mid)
            walk(start + k, end, mid, hi)

    if size:
        walk(0, size, 0, len(indices))
    return _covers(gaps)


def _path(index: int, size: int) -> Iterator[tuple[bool, int, int]]:
    """``(on the left, start, end)`` of the range of each hash of ``PATH(index, D[0:size])``, leaf
    side first, one at a time: what ``inclusion_nodes``, ``inclusion_proof``, ``path_nodes`` and
    ``inclusion_root`` all read, so the path is derived in one place.

    RFC 9162's tree is the tree of aligned power-of-two subtrees in which a node without a right
    sibling (past ``size``) is promoted unchanged: at each level the leaf's subtree has its sibling
    on the left (a complete subtree), or on the right clipped to ``size``, or none.
    """
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of size {size}")
    level = 0
    while index >> level or 1 << level < size:  # until the leaf's subtree is the whole tree
        node = index >> level
        if node & 1:
            yield True, (node - 1) << level, node << level
        elif (start := (node + 1) << level) < size:
            end = (node + 2) << level
            yield False, start, end if end < size else size
        level += 1


def inclusion_nodes(index: int, size: int) -> list[NodeKey]:
    """The stored subtrees ``inclusion_proof(index, size)`` reads."""
    return [key for _, start, end in _path(index, size) for key in _perfect_cover(start, end)]


def path_nodes(index: int, size: int) -> Iterator[NodeKey]:
    """The stored subtrees ``inclusion_nodes(index, size)`` names, one at a time, in the order
    ``inclusion_root`` folds them: the proof's hashes leaf side first, each one's subtrees right to left."""
    for _, start, end in _path(index, size):
        yield from reversed(_perfect_cover(start, end))


def inclusion_root(leaf: bytes, index: int, size: int, hashes: Iterable[bytes]) -> bytes | None:
    """The root of ``size`` leaves that the leaf *hash* ``leaf`` at ``index`` makes with the stored
    subtrees ``path_nodes(index, size)`` names, given in that order: an inclusion proof folded as
    its hashes arrive, holding none of them (``verify_inclusion`` over ``inclusion_proof`` gives the
    same answer: the leaf is in the tree whose root this equals).

    ``None`` when a hash is not 32 bytes or ``hashes`` holds fewer or more than the path needs;
    ``hashes`` is read to its end, so that a lookup streaming them can report a node it lacks.
    """
    if not _is_hash(leaf):
        return None
    stream = iter(hashes)
    acc = leaf
    for left, start, end in _path(index, size):
        sibling = _range_from(stream, end - start)
        if sibling is None:
            return None
        acc = node_hash(sibling, acc) if left else node_hash(acc, sibling)
    if next(stream, None) is not None:
        return None
    return acc


def _range_from(stream: Iterator[bytes], width: int) -> bytes | None:
    """The hash of a path's range of ``width`` leaves from the next hashes of ``stream`` (its
    perfect subtrees right to left, as ``path_nodes`` names them); None when one is not a hash."""
    sibling: bytes | None = None
    for _ in range(width.bit_count()):
        value = next(stream, None)
        if not isinstance(value, bytes) or len(value) != HASH_SIZE:
            return None
        sibling = value if sibling is None else node_hash(value, sibling)
    return sibling  # every range of a path is non-empty


# Subtrees of the last proven path a LeafProver keeps: the lowest ones and the root. Adjacent leaves
# meet below the kept ones but once in 2**(_PATH_KEPT - 1); then one proof reads up to the root.
_PATH_KEPT = 9


class LeafProver:
    """Leaves proven one at a time against one tree head, each fold stopping at the first subtree on
    the path of the last leaf this prover proved (whose hashes reached the root, so each is
    authenticated by it).

    ``prove`` answers what ``inclusion_root(...) == root`` answers for the same leaf and stored
    nodes, but reads and hashes only the path's part below that subtree: for the adjacent leaves of
    one session that is about two nodes a leaf instead of ``log2(size)``, so proving a session's
    entries one by one costs the same in a log of 20,000 sessions as in one of 200. The nodes it does
    not read are the siblings above that subtree, which the earlier proof read and checked; a proof
    that fails changes nothing, so every answer rests on ``root`` alone. It holds the lowest
    subtrees of that path and the root (``_PATH_KEPT`` hashes at most), so its memory is the same
    at any size of the log.
    """

    __slots__ = ("_path", "root", "size")

    def __init__(self, size: int, root: bytes) -> None:
        self.size = size
        self.root = root
        # The last proven leaf's path: (start, end, hash) of the subtrees holding it, leaf first, the
        # root last (the middle ones past _PATH_KEPT dropped); each strictly wider than the one
        # before, so a width names at most one of them.
        self._path: list[tuple[int, int, bytes]] = [(0, size, root)]

    def prove(self, leaf: bytes, index: int, node_hashes: NodeHashes) -> bool:
        """Whether the leaf *hash* ``leaf`` is the leaf at ``index`` of the tree whose root is ``root``,
        with ``node_hashes`` answering the stored subtrees it asks for (asked once, in the order
        ``path_nodes`` would give them, read to its end)."""
        if not 0 <= index < self.size:
            raise ValueError(f"leaf {index} is not in a tree of size {self.size}")
        if not _is_hash(leaf):
            return False
        known = self._path
        at = 0  # the narrowest known subtree at least as wide as the range reached
        lo, hi = index, index + 1
        depth = 0  # the steps of the path below that subtree: the only ones read and folded
        walk = _path(index, self.size)
        while True:
            while known[at][1] - known[at][0] < hi - lo:
                at += 1
            if known[at][0] == lo and known[at][1] == hi:
                break
            left, start, end = next(walk)  # the walk ends at the whole tree, which the last known subtree is
            depth += 1
            lo, hi = (start, hi) if left else (lo, end)
        # Walked again rather than held, so a proof's memory is the same at any size of the log.
        steps = islice(_path(index, self.size), depth)
        stream = iter(node_hashes(key for _, s, e in steps for key in reversed(_perfect_cover(s, e))))
        acc = leaf
        lo, hi = index, index + 1
        folded: list[tuple[int, int, bytes]] = []  # this leaf's lowest subtrees, kept for the next proof
        for left, start, end in islice(_path(index, self.size), depth):
            if len(folded) < _PATH_KEPT - 1:
                folded.append((lo, hi, acc))
            sibling = _range_from(stream, end - start)
            if sibling is None:
                return False
            acc = node_hash(sibling, acc) if left else node_hash(acc, sibling)
            lo, hi = (start, hi) if left else (lo, end)
        if next(stream, None) is not None or acc != known[at][2]:
            return False
        folded += known[at:]
        if len(folded) > _PATH_KEPT:  # the lowest subtrees and the root: the same memory at any log size
            del folded[_PATH_KEPT - 1 : -1]
        self._path = folded
        return True


def inclusion_proof(index: int, size: int, get_node: GetNode) -> list[bytes]:
    """RFC 9162 section 2.1.3.1 ``PATH(index, D[0:size])``, leaf side first."""
    return [_range_hash(start, end, get_node) for _, start, end in _path(index, size)]


def _consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """The ranges whose hashes make ``PROOF(old, D[0:new])``, root side first."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")
    if old in (0, new):
        return []
    ranges: list[tuple[int, int]] = []
    start, end, m, complete = 0, new, old, True
    while m != end - start:
        k = _largest_power_of_two_below(end - start)
        if m <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            m -= k
            complete = False
    if not complete:
        ranges.append((start, end))
    return ranges


def consistency_nodes(old: int, new: int) -> list[NodeKey]:
    """The stored subtrees ``consistency_proof(old, new)`` reads."""
    return _covers(_consistency_ranges(old, new))


def consistency_proof(old: int, new: int, get_node: GetNode) -> list[bytes]:
    """RFC 9162 section 2.1.4.1 ``PROOF(old, D[0:new])``; empty when ``old`` is 0 or ``new``."""
    return [_range_hash(start, end, get_node) for start, end in reversed(_consistency_ranges(old, new))]


def _well_formed(proof: Sequence[bytes], *hashes: bytes) -> bool:
    if len(proof) > _MAX_PROOF_LEN:
        return False
    # Callers may hand over values decoded from untrusted JSON; anything but 32 bytes fails.
    return all(_is_hash(h) for h in (*proof, *hashes))


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2: is the leaf *hash* ``leaf`` at ``index`` in the tree ``root``?"""
    if not _well_formed(proof, leaf, root) or not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """RFC 9162 section 2.1.4.2: does the tree ``new_root`` of ``new`` leaves extend ``old_root``?

    ``old == new`` needs an empty proof and equal roots; ``old == 0`` needs an empty proof and
    the empty-tree root (every tree extends the empty one).
    """
    if not _well_formed(proof, old_root, new_root) or not 0 <= old <= new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if old == 0:
        return not proof and old_root == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


class MemoryTree:
    """A whole tree in memory: a ``Frontier`` plus every completed node in a dict.

    For tests, benchmarks and in-memory stores; a durable store keeps the same nodes in a table.
    """

    __slots__ = ("frontier", "nodes")

    def __init__(self) -> None:
        self.frontier = Frontier()
        self.nodes: dict[tuple[int, int], bytes] = {}

    @property
    def size(self) -> int:
        return self.frontier.size

    def append(self, entry_bytes: bytes) -> int:
        """Add one leaf (the entry's bytes, hashed here); returns its index."""
        index = self.frontier.size
        for level, node_index, value in self.frontier.append(leaf_hash(entry_bytes)):
            self.nodes[(level, node_index)] = value
        return index

    def get_node(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]

    def get_nodes(self, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
        return {key: self.nodes[key] for key in keys}

    def root(self, size: int | None = None) -> bytes:
        return self.frontier.root() if size is None else root_at(size, self.get_node)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if size is None else size, self.get_node)

    def consistency_proof(self, old: int, new: int | None = None) -> list[bytes]:
        return consistency_proof(old, self.size if new is None else new, self.get_node)
