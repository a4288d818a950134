"""C2SP tlog-policy: which logs and witnesses count, and the quorum a checkpoint needs; fork evidence.

A policy file is line based (``parse_policy``)::

    log <vkey> [<url>]                          # a log key (type 0x01); its name is the origin
    witness <name> <vkey> [<url>]               # a witness: its cosignature key (0x04 or 0x06)
    group <name> all|any|<k> <member>...        # k of its members must have witnessed
    quorum <name>                               # exactly one; `none` needs no cosignature

Items are separated by spaces or tabs; blank lines and ``#`` comments are ignored; a group or the
quorum names only witnesses and groups defined on earlier lines, and each name is a member of at
most one group. Octets allowed: tab, newline, 0x20-0x7E and 0x80 and above (names are UTF-8
here). Bounds: 64 KiB, 256 logs, witnesses and groups each.

``evaluate`` says whether a set of witnesses that cosigned meets the quorum, and if not, which
groups are short and which of their members are missing. ``verify_witnessed`` opens a
checkpoint note, verifies its cosignatures by the policy's witnesses and evaluates the quorum.
``find_fork`` looks at several checkpoints of one log and returns two that cannot both be true
(same size, different roots): both are signed by the log, so the pair is proof that it showed two
histories.

Sans-IO. What it does not do: fetch cosignatures (``truss.witness``) or trust anything a file
does not name: the caller passes the policy it trusts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from truss._errors import InputError, PolicyError, VerificationError
from truss.ledger.cosignature import Cosignature, verify_cosignatures
from truss.ledger.keys import CosignerVerifier, VerifierKey
from truss.ledger.note import Checkpoint, open_checkpoint

__all__ = [
    "MAX_POLICY_BYTES",
    "Fork",
    "Group",
    "Policy",
    "PolicyLog",
    "PolicyWitness",
    "Quorum",
    "Shortfall",
    "Witnessed",
    "cosigned_by",
    "evaluate",
    "find_fork",
    "parse_policy",
    "verify_witnessed",
]

MAX_POLICY_BYTES = 64 * 1024
_MAX_ITEMS = 256
NONE = "none"


@dataclass(frozen=True)
class PolicyLog:
    key: VerifierKey
    url: str | None = None


@dataclass(frozen=True)
class PolicyWitness:
    name: str
    key: CosignerVerifier
    url: str | None = None


@dataclass(frozen=True)
class Group:
    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Policy:
    """A parsed policy: logs, witnesses and groups by name, and the quorum's name (or ``none``)."""

    logs: tuple[PolicyLog, ...]
    witnesses: Mapping[str, PolicyWitness]
    groups: Mapping[str, Group]
    quorum: str
    source: str = ""

    @classmethod
    def empty(cls, source: str = "no policy") -> Policy:
        """No witnesses, ``quorum none``: what fork checks use when no policy is given."""
        return cls((), {}, {}, NONE, source=source)

    def log_keys(self) -> list[VerifierKey]:
        return [log.key for log in self.logs]

    def witness_named(self, name: str) -> PolicyWitness | None:
        return self.witnesses.get(name)


def _error(file: str, line: int | None, message: str) -> PolicyError:
    return PolicyError(
        message,
        remedy="fix the policy file (the format is C2SP tlog-policy; docs/witness.md has an example)",
        file=file,
        line=line,
    )


def parse_policy(data: bytes | str, *, file: str = "<policy>") -> Policy:
    """Parse a tlog-policy text; raises ``PolicyError`` (with ``file`` and ``line``)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if len(raw) > MAX_POLICY_BYTES:
        raise _error(file, None, f"a policy file is at most {MAX_POLICY_BYTES} bytes")
    for offset, octet in enumerate(raw):
        if (octet < 0x20 and octet not in (0x09, 0x0A)) or octet == 0x7F:
            line = raw.count(b"\n", 0, offset) + 1
            what = "a carriage return (use Unix line endings)" if octet == 0x0D else f"the control byte 0x{octet:02x}"
            raise _error(file, line, f"the policy holds {what}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(file, raw.count(b"\n", 0, exc.start) + 1, "the policy is not UTF-8 text") from None
    logs: list[PolicyLog] = []
    witnesses: dict[str, PolicyWitness] = {}
    groups: dict[str, Group] = {}
    used_as_member: set[str] = set()
    public_keys: set[bytes] = set()
    quorum: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        items = line.replace("\t", " ").split()
        if not items or items[0].startswith("#"):
            continue
        keyword, args = items[0], items[1:]
        try:
            if keyword == "log":
                if len(args) not in (1, 2):
                    raise _error(file, number, "a log line is `log <vkey> [<url>]`")
                key = VerifierKey.parse(args[0])
                if key.public_key in public_keys:
                    raise _error(file, number, f"the key of log {key.name!r} is listed twice")
                public_keys.add(key.public_key)
                logs.append(PolicyLog(key, args[1] if len(args) == 2 else None))
            elif keyword == "witness":
                if len(args) not in (2, 3):
                    raise _error(file, number, "a witness line is `witness <name> <vkey> [<url>]`")
                name = args[0]
                _check_new_name(file, number, name, witnesses, groups)
                cosigner = CosignerVerifier.parse(args[1])
                if cosigner.public_key in public_keys:
                    raise _error(file, number, f"the key of witness {name!r} is listed twice")
                public_keys.add(cosigner.public_key)
                witnesses[name] = PolicyWitness(name, cosigner, args[2] if len(args) == 3 else None)
            elif keyword == "group":
                if len(args) < 3:
                    raise _error(file, number, "a group line is `group <name> all|any|<k> <member>...`")
                name, threshold_text, members = args[0], args[1], tuple(args[2:])
                _check_new_name(file, number, name, witnesses, groups)
                for member in members:
                    if member == NONE:
                        raise _error(file, number, "`none` cannot be a group member")
                    if member not in witnesses and member not in groups:
                        raise _error(file, number, f"group {name!r}: {member!r} is not defined on an earlier line")
                    if member in used_as_member:
                        raise _error(file, number, f"{member!r} is already a member of a group (at most one)")
                    used_as_member.add(member)
                groups[name] = Group(name, _threshold(file, number, threshold_text, len(members)), members)
            elif keyword == "quorum":
                if len(args) != 1:
                    raise _error(file, number, "a quorum line is `quorum <name>`")
                if quorum is not None:
                    raise _error(file, number, "a policy has exactly one quorum line")
                if args[0] != NONE and args[0] not in witnesses and args[0] not in groups:
                    raise _error(file, number, f"the quorum {args[0]!r} is not defined on an earlier line")
                quorum = args[0]
            else:
                raise _error(file, number, f"unknown line type {keyword[:40]!r} (log, witness, group or quorum)")
        except PolicyError:
            raise
        except InputError as exc:
            raise _error(file, number, exc.message) from None
        if max(len(logs), len(witnesses), len(groups)) > _MAX_ITEMS:
            raise _error(file, number, f"a policy has at most {_MAX_ITEMS} logs, witnesses and groups each")
    if quorum is None:
        raise _error(file, None, "the policy has no quorum line (write `quorum none` to require no witness)")
    return Policy(tuple(logs), witnesses, groups, quorum, source=file)


def _check_new_name(
    file: str, line: int, name: str, witnesses: Mapping[str, object], groups: Mapping[str, object]
) -> None:
    if name == NONE:
        raise _error(file, line, "`none` is a reserved name")
    if name in witnesses or name in groups:
        raise _error(file, line, f"the name {name!r} is defined twice (witnesses and groups share names)")


def _threshold(file: str, line: int, text: str, members: int) -> int:
    if text == "all":
        return members
    if text == "any":
        return 1
    if not text.isascii() or not text.isdigit() or text.startswith("0"):
        raise _error(file, line, f"a group's threshold is all, any or a decimal k, not {text[:20]!r}")
    k = int(text)
    if not 1 <= k <= members:
        raise _error(file, line, f"a threshold of {k} needs 1 <= k <= {members} (its members)")
    return k


# -- the quorum -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shortfall:
    """A group (or the single witness the quorum names) that did not witness: how many it had,
    how many it needed, and which of its members did not."""

    name: str
    have: int
    need: int
    missing: tuple[str, ...]

    def describe(self) -> str:
        if self.need == 1 and len(self.missing) == 1 and self.missing[0] == self.name:
            return f"witness {self.name} has not cosigned"
        return f"group {self.name} has {self.have} of the {self.need} it needs (missing: {', '.join(self.missing)})"


@dataclass(frozen=True)
class Quorum:
    ok: bool
    cosigned: tuple[str, ...] = ()
    short: tuple[Shortfall, ...] = ()

    def describe(self) -> str:
        if self.ok:
            return "quorum met" + (f" ({', '.join(self.cosigned)})" if self.cosigned else "")
        return "; ".join(s.describe() for s in self.short)


def evaluate(policy: Policy, cosigned: Iterable[str]) -> Quorum:
    """Whether the witnesses named in ``cosigned`` meet the policy's quorum, and if not, why."""
    have = frozenset(cosigned)
    short: list[Shortfall] = []

    def witnessed(name: str) -> bool:
        if name in policy.witnesses:
            return name in have
        group = policy.groups[name]
        results = [witnessed(m) for m in group.members]
        count = sum(results)
        if count < group.threshold:
            missing = tuple(m for m, ok in zip(group.members, results, strict=True) if not ok)
            short.append(Shortfall(group.name, count, group.threshold, missing))
            return False
        return True

    names = tuple(sorted(n for n in have if n in policy.witnesses))
    if policy.quorum == NONE:
        return Quorum(ok=True, cosigned=names)
    if witnessed(policy.quorum):
        return Quorum(ok=True, cosigned=names)
    if policy.quorum in policy.witnesses:
        short.append(Shortfall(policy.quorum, 0, 1, (policy.quorum,)))
    # The quorum's group is reported first, then the groups below it that fell short.
    short.reverse()
    return Quorum(ok=False, cosigned=names, short=tuple(short))


# -- checkpoints under a policy --------------------------------------------------------------------


@dataclass(frozen=True)
class Witnessed:
    """A checkpoint opened under a policy: its body, the verified cosignatures by the policy's
    witnesses (by witness name), and the quorum they reach. ``source`` says where it came from."""

    checkpoint: Checkpoint
    cosignatures: Mapping[str, Cosignature]
    quorum: Quorum
    source: str = ""
    extra: Mapping[str, str] = field(default_factory=dict[str, str])

    def describe(self) -> str:
        who = ", ".join(sorted(self.cosignatures)) or "no witness of the policy"
        return f"{self.source or 'checkpoint'}: size {self.checkpoint.size}, cosigned by {who}"


def verify_witnessed(
    note: bytes,
    policy: Policy,
    log_keys: Iterable[VerifierKey] | None = None,
    *,
    origin: str | None = None,
    source: str = "",
) -> Witnessed:
    """Open ``note`` (signed by a key in ``log_keys``, named after the origin), verify the
    cosignatures of the policy's witnesses on it and evaluate the quorum.

    ``log_keys`` are the keys allowed to sign this checkpoint (after a rotation, those of the key
    history at its size); only when it is ``None`` do the policy's ``log`` keys sign. Given keys are
    not widened by the policy's: a policy written before a rotation names the retired key, which
    must not sign a checkpoint past its period. The policy's ``log`` lines still say which logs count.

    Raises ``VerificationError`` when the note does not verify (its own reasons), when a
    witness's cosignature fails (``bad_cosignature``), or when the policy lists logs and this
    checkpoint's origin is not one of them (``log_not_in_policy``); ``BundleFormatError`` when it
    cannot be parsed. An unmet quorum is not an error here: ``quorum.ok`` is false.
    """
    keys = policy.log_keys() if log_keys is None else list(log_keys)
    checkpoint = open_checkpoint(note, keys, origin=origin)
    if policy.logs and checkpoint.origin not in {log.key.name for log in policy.logs}:
        raise VerificationError(
            f"the policy does not list the log {checkpoint.origin!r}",
            remedy="add a `log` line for it, or check the checkpoint against the policy of its log",
            reason="log_not_in_policy",
            origin=checkpoint.origin,
        )
    found = cosigned_by(policy, note)
    return Witnessed(checkpoint, found, evaluate(policy, found), source=source)


def _keys(policy: Policy) -> list[CosignerVerifier]:
    return [w.key for w in policy.witnesses.values()]


def _owner(policy: Policy, cosig: Cosignature) -> list[str]:
    """The witness of ``policy`` whose key ``cosig`` verified under (by the key itself: a (name, key
    id) pair, 4 bytes of hash, can be ground to collide with another witness's)."""
    return [w.name for w in policy.witnesses.values() if w.key is cosig.verifier][:1]


def cosigned_by(policy: Policy, note: bytes) -> dict[str, Cosignature]:
    """The witnesses of ``policy`` with a verified cosignature on ``note``, each with it.

    Raises like ``verify_cosignatures`` (``bad_cosignature``, ``BundleFormatError``).
    """
    return {name: cosig for cosig in verify_cosignatures(note, _keys(policy)) for name in _owner(policy, cosig)}


@dataclass(frozen=True)
class Fork:
    """Two checkpoints of one log at one size with different roots: ``first`` and ``second``."""

    first: Witnessed
    second: Witnessed

    def describe(self) -> str:
        size = self.first.checkpoint.size
        return (
            f"the log {self.first.checkpoint.origin} signed two different trees of size {size}: "
            f"{self.first.describe()} (root {self.first.checkpoint.root.hex()[:16]}...) and "
            f"{self.second.describe()} (root {self.second.checkpoint.root.hex()[:16]}...)"
        )


def find_fork(checkpoints: Sequence[Witnessed]) -> Fork | None:
    """The first pair of checkpoints of the same log and size whose roots differ, if any."""
    seen: dict[tuple[str, int], Witnessed] = {}
    for item in checkpoints:
        key = (item.checkpoint.origin, item.checkpoint.size)
        before = seen.get(key)
        if before is None:
            seen[key] = item
        elif before.checkpoint.root != item.checkpoint.root:
            return Fork(before, item)
    return None
