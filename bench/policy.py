"""Policy and budget cost per call, next to the ledger work every call pays anyway.

Run: ``.venv/bin/python bench/policy.py [--calls N] [--rounds R]``. Each measure prints the
median over R rounds of N calls (microseconds per call) and its ratio to a baseline measured in
the same run: sealing one ``mcp_tool_intent`` entry (canonical bytes, SHA-256, Ed25519), which
the gate does for every allowed call before it is sent.

- decide: ``policy.decide`` against a 12-rule policy (tool globs, ``not_glob``, ``regex``,
  ``in``, ``max_len``, ``min``/``max``) for a mix of calls, plus ``budget.charge_call``.
- hostile: the worst an argument can cost: a 65,536-character string under a glob, and a
  string at the length limit of a pattern with three free repetitions (``.*a.*a.*b``), and one
  at the limit of a back-reference pattern (``(.*)\\1``), each backtracking as much as it can.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from truss.budget import BudgetState, Charged, charge_call
from truss.contract import Contract
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.entry import ZERO_HASH, seal
from truss.ledger.keys import IdentityKey
from truss.policy import MAX_MATCH_CHARS, decide, regex_profile
from truss.tools import MountedTool

SERVERS = [
    {
        "name": "fs",
        "command": "fs-server",
        "allow_tools": ["read", "write_file", "list", "delete"],
        "budget_calls": 10**9,
    },
    {"name": "git", "command": "git-server", "allow_tools": ["git_status", "git_log", "git_diff"]},
    {"name": "web", "command": "web-server", "allow_tools": ["fetch"]},
]
RULES: list[dict[str, Any]] = [
    {"tool": "mcp:fs:delete", "effect": "deny", "reason": "no deletes"},
    {"tool": "mcp:fs:write_*", "effect": "ask", "args": {"path": {"glob": "/srv/prod/**"}}},
    {"tool": "mcp:fs:*", "effect": "deny", "args": {"path": {"not_glob": "/srv/**"}}},
    {"tool": "mcp:fs:*", "effect": "deny", "args": {"path": {"max_len": 0}}},
    {"tool": "mcp:git:git_log", "effect": "deny", "args": {"max_count": {"min": 1001}}},
    {"tool": "mcp:git:*", "effect": "deny", "args": {"repo_path": {"not_glob": "/srv/repos/*"}}},
    {"tool": "mcp:git:git_diff", "effect": "allow", "args": {"target": {"in": ["HEAD", "main", "dev"]}}},
    {"tool": "mcp:git:git_diff", "effect": "ask"},
    {"tool": "mcp:web:fetch", "effect": "allow", "args": {"url": {"regex": r"https://docs\.example\.com/[\w/.-]*"}}},
    {"tool": "mcp:web:fetch", "effect": "deny", "reason": "only the docs site"},
    {"tool": "mcp:git:*", "effect": "allow"},
    {"tool": "mcp:fs:*", "effect": "allow"},
]
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("mcp:fs:read", {"path": "/srv/work/notes/today.md"}),
    ("mcp:fs:write_file", {"path": "/srv/work/out.txt", "content": "x" * 2000}),
    ("mcp:fs:read", {"path": "/etc/passwd"}),
    ("mcp:git:git_log", {"repo_path": "/srv/repos/truss", "max_count": 20}),
    ("mcp:git:git_diff", {"repo_path": "/srv/repos/truss", "target": "main"}),
    ("mcp:web:fetch", {"url": "https://docs.example.com/guide/policy.html"}),
    ("mcp:web:fetch", {"url": "https://evil.example.net/"}),
    ("mcp:fs:list", {}),
]


def _contract(rules: list[dict[str, Any]]) -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "bench", "intent": "bench"},
            "budget": {"max_tool_calls": 10**9, "deadline": "1h"},
            "policy": {"default": "deny", "rules": rules},
            "mcp": {"servers": SERVERS},
        }
    )


def _mounted(contract: Contract) -> dict[str, MountedTool]:
    tools = [
        MountedTool(s.name, t, {"name": t, "inputSchema": {"type": "object"}}, "sha256:" + "0" * 64)
        for s in contract.mcp.servers
        for t in s.allow_tools
    ]
    return {t.name: t for t in tools}


def _per_call_us(fn: Callable[[int], None], calls: int, rounds: int) -> float:
    samples: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    contract = _contract(RULES)
    mounted = _mounted(contract)
    key = IdentityKey.generate("bench.truss.test")
    state = [BudgetState.start(0)]

    def baseline(i: int) -> None:
        tool, arguments = CALLS[i % len(CALLS)]
        body = {"call": f"c{i}", "tool": tool, "args": sha256_ref(canonical(arguments))}
        seal(
            key,
            log=key.name,
            session="s_bench",
            seq=i,
            index=i,
            ts=i,
            kind="mcp_tool_intent",
            body=body,
            prev=ZERO_HASH,
        )

    def gate_decisions(i: int) -> None:
        tool, arguments = CALLS[i % len(CALLS)]
        decide(contract, tool, arguments, mounted)
        charged = charge_call(state[0], contract, tool, i)
        if isinstance(charged, Charged):
            state[0] = charged.state

    huge = {"path": "/srv/work/" + "a" * (MAX_MATCH_CHARS - 10)}
    glob_contract = _contract([{"tool": "*", "effect": "deny", "args": {"path": {"not_glob": "/srv/work/*.txt"}}}])
    pattern = ".*a.*a.*b"
    limit = regex_profile(pattern).max_chars
    crafted = {"s": "a" * limit}
    regex_contract = _contract([{"tool": "*", "effect": "allow", "args": {"s": {"regex": pattern}}}])

    backref = r"(.*)\1"
    backref_limit = regex_profile(backref).max_chars
    crafted_backref = {"s": "a" * (backref_limit - 1) + "b"}
    backref_contract = _contract([{"tool": "*", "effect": "allow", "args": {"s": {"regex": backref}}}])

    def hostile_backref(_: int) -> None:
        decide(backref_contract, "mcp:fs:read", crafted_backref, mounted)

    def hostile_glob(_: int) -> None:
        decide(glob_contract, "mcp:fs:read", huge, mounted)

    def hostile_regex(_: int) -> None:
        decide(regex_contract, "mcp:fs:read", crafted, mounted)

    base = _per_call_us(baseline, args.calls, args.rounds)
    rows = [
        ("decide + charge_call, 12-rule policy, mixed calls", _per_call_us(gate_decisions, args.calls, args.rounds)),
        (f"hostile: {MAX_MATCH_CHARS}-char string under a glob", _per_call_us(hostile_glob, 50, args.rounds)),
        (f"hostile: {limit}-char string under {pattern!r}", _per_call_us(hostile_regex, 5, args.rounds)),
        (f"hostile: {backref_limit}-char string under {backref!r}", _per_call_us(hostile_backref, 5, args.rounds)),
    ]
    print(f"baseline: seal one mcp_tool_intent entry: {base:9.1f} us/call")
    for label, value in rows:
        print(f"{label:55s} {value:11.1f} us/call  ratio {value / base:7.3f}")


if __name__ == "__main__":
    main()
