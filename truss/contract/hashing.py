"""The contract hash: ``sha256:`` over the RFC 8785 canonical bytes of the effective contract's JSON form.

The JSON form (``Contract.to_json``) uses the keys' TOML names and leaves out keys whose value is
None, so the hash covers what is in force and nothing else; templates (``${env.X}``) are hashed as
written, never their values. The hash is recorded in ``session_started`` and in the verdict, so a
verdict attests which servers, allowlists, budgets and checks were in force. Pure.
"""

from __future__ import annotations

from typing import Any, Protocol

from truss.ledger.canonical import canonical, sha256_ref

__all__ = ["contract_hash"]


class _HasJsonForm(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def contract_hash(contract: _HasJsonForm) -> str:
    """``sha256:`` over the RFC 8785 bytes of the effective contract's JSON form."""
    return sha256_ref(canonical(contract.to_json()))
