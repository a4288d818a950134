"""The ``Runtime``: everything a run takes from its surroundings, built once at the edge.

``run_contract``, ``resume_session``, ``replay_session``, ``approve_call``, ``resolve_call``,
``deliver_signal`` and serve-mcp take one ``Runtime`` instead of a dozen keyword arguments:

- ``store``: the ledger, typed as the ``LedgerStore`` protocol (any registered backend);
- ``key``: the identity key that signs checkpoints and verdict envelopes (the store signs entries
  with the key it was opened with); ``trusted``: the verifier keys reads are checked against
  (default: the key's own verifier);
- ``clock``: the only source of time and ids (``truss._clock``; default the system clock);
- ``home``: where logs and exports go (default ``./.truss``); ``environ``: where ``${env.X}`` and
  ``secret_env`` values come from (default empty; never recorded);
- ``connector``: how a run reaches its MCP servers (``truss.mcp.connect``; the core never
  imports the MCP tier, so the edge passes it);
- ``provider``: a factory for the model provider (default: the contract's ``agent.provider``
  from ``truss.providers.PROVIDERS``); ``events``: the subscribers to the run's typed events
  (``truss.events``; ``progress_subscriber`` adapts a callback of the flat ``ProgressEvent``).

It is a frozen value: a caller that wants another subscriber for one run makes a copy
(``dataclasses.replace(runtime, events=(*runtime.events, mine))``). Later capabilities add fields
here (a session lease's owner id, registries) rather than parameters to every entry point.

``Runtime.open(home=...)`` builds one the way ``truss`` does (the CLI calls it once per command):
the store from ``--db`` (a path or URL, default ``HOME/ledger.db``), the key from ``--key``
(default ``HOME/identity.key``). What it does not do: connect servers or start runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from truss._clock import Clock, SystemClock, new_owner_id, parse_duration_ms
from truss._errors import KeyFileError, UsageError

if TYPE_CHECKING:
    from truss.contract import Contract
    from truss.events import Subscriber
    from truss.ledger.keys import IdentityKey, TrustedKeys
    from truss.ledger.stores import LedgerStore
    from truss.ledger.stores.base import LeaseOwner
    from truss.providers.base import Provider

__all__ = ["Connector", "ProviderFactory", "Runtime"]

Connector = Callable[..., AbstractAsyncContextManager[Any]]
"""``connector(contract, log_dir=, environ=, clock=, on_event=)``: an async context yielding the mount set."""
ProviderFactory = Callable[["Contract"], "Provider"]


@dataclass(frozen=True, eq=False)
class Runtime:
    """What a run needs from its surroundings (see the module docstring).

    Compared by identity; its ``repr`` leaves out ``environ`` (it holds secrets) and shows the key
    only by name and id.
    """

    store: LedgerStore
    clock: Clock = field(default_factory=SystemClock)
    home: Path = field(default_factory=lambda: Path(".truss"))
    key: IdentityKey | None = None
    environ: Mapping[str, str] = field(default_factory=dict[str, str], repr=False)
    connector: Connector | None = None
    provider: ProviderFactory | None = None
    events: Sequence[Subscriber] = ()
    trusted_keys: TrustedKeys | None = None
    owner: LeaseOwner | None = None
    lease_ms: int = 30_000

    def __post_init__(self) -> None:
        # Every read of the ledger goes through the one verified reader (truss.ledger.reader);
        # writes go to the store it wraps.
        from truss._sigcheck import process_checks
        from truss.ledger.reader import VerifiedStore
        from truss.ledger.stores.base import LeaseOwner

        if self.owner is None:  # one owner id per runtime; copies (dataclasses.replace) keep it
            object.__setattr__(self, "owner", LeaseOwner.this_process(new_owner_id()))

        # A long session's signature checks (V10) run ahead in a helper process (truss._sigcheck).
        verified = VerifiedStore(self.store, lambda: self.trusted, now_ms=self.clock.now_ms, signatures=process_checks)
        object.__setattr__(self, "store", verified)

    @classmethod
    def open(
        cls,
        *,
        home: str | os.PathLike[str],
        db: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        signing: bool = True,
        create: bool = False,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
        connector: Connector | None = None,
        provider: ProviderFactory | None = None,
        events: Sequence[Subscriber] = (),
    ) -> Runtime:
        """The runtime of a Truss home: its ledger (``db``, default ``HOME/ledger.db``, a path or a
        store URL) and, with ``signing``, its identity key (``key``, default ``HOME/identity.key``).

        ``create`` lets the store create a missing ledger; otherwise a missing one is a
        ``NotFoundError``. ``environ`` defaults to a copy of this process's environment; its
        ``TRUSS_LEASE`` and ``TRUSS_HOST`` set ``lease_ms`` and the lease owner's host (a bad value
        is a ``UsageError``).
        """
        from truss.ledger.keys import IdentityKey
        from truss.ledger.stores import open_store

        home_path = Path(home)
        clock = clock or SystemClock()
        env = dict(os.environ if environ is None else environ)
        lease_ms, owner = _lease_settings(env)
        identity = IdentityKey.load(Path(key) if key is not None else home_path / "identity.key") if signing else None
        store = open_store(db if db is not None else home_path / "ledger.db", key=identity, clock=clock, create=create)
        return cls(
            trusted_keys=_home_trust(Path(key) if key is not None else home_path / "identity.key"),
            store=store,
            clock=clock,
            home=home_path,
            key=identity,
            environ=env,
            connector=connector,
            provider=provider,
            events=tuple(events),
            owner=owner,
            lease_ms=lease_ms,
        )

    @property
    def signer(self) -> IdentityKey:
        """The identity key; ``KeyFileError`` when this runtime was opened without one."""
        if self.key is None:
            raise KeyFileError(
                "this command opened the ledger without the identity key, so it cannot sign",
                remedy="give the key (--key FILE, or HOME/identity.key from `truss init`)",
            )
        return self.key

    @property
    def trusted(self) -> TrustedKeys:
        """The verifier keys reads are checked against: ``trusted_keys``, else the key's own."""
        if self.trusted_keys is not None:
            return self.trusted_keys
        from truss.ledger.keys import TrustedKeys

        if self.key is None:
            raise KeyFileError(
                "the ledger is read only through what verifies, and this runtime has no key to verify it with",
                remedy="give the home's identity key (--key FILE, or HOME/identity.key), or build the Runtime "
                "with trusted_keys",
            )
        return TrustedKeys([self.key.verifier])

    @property
    def lease_owner(self) -> LeaseOwner:
        """Who this runtime's runs are, as a session's lease names them (id, host, pid)."""
        assert self.owner is not None  # set in __post_init__
        return self.owner

    def connect(self) -> Connector:
        """The connector; ``UsageError`` for a runtime built without one (replay and approvals need none)."""
        if self.connector is None:
            raise UsageError(
                "this runtime has no connector, so it cannot reach MCP servers",
                remedy="build the Runtime with connector=truss.mcp.connect",
            )
        return self.connector

    def close(self) -> None:
        """Close the store (a runtime from ``open`` owns it)."""
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _home_trust(key_path: Path) -> TrustedKeys | None:
    """The keys a home's reads are checked against: its first key (rotations are followed from it)."""
    from truss.keyring import trust_root
    from truss.ledger.keys import TrustedKeys

    try:
        return TrustedKeys(trust_root(key_path))
    except KeyFileError:
        return None  # no readable key: reads that need it say so (``Runtime.trusted``)


def _lease_settings(environ: Mapping[str, str]) -> tuple[int, LeaseOwner | None]:
    """``TRUSS_LEASE`` (a duration: how long a session's lease lasts unless renewed) and ``TRUSS_HOST``
    (the host name leases record for this process), from the environment (docs/durability.md).

    Unset, the lease lasts 30 s and the owner is this process on ``socket.gethostname()``.
    """
    from truss.ledger.stores.base import DEFAULT_LEASE_MS, LeaseOwner

    lease_ms = DEFAULT_LEASE_MS
    given = environ.get("TRUSS_LEASE", "").strip()
    if given:
        try:
            lease_ms = parse_duration_ms(given)
        except ValueError as exc:
            raise UsageError(
                f"TRUSS_LEASE: {exc}", remedy="set TRUSS_LEASE to a duration such as '30s', or unset it"
            ) from None
    host = environ.get("TRUSS_HOST", "").strip()
    if not host:
        return lease_ms, None
    if len(host) > 255 or not host.isprintable():
        raise UsageError(
            "TRUSS_HOST: give a printable host name of at most 255 characters",
            remedy="set TRUSS_HOST to this machine's name as other hosts should see it, or unset it",
        )
    return lease_ms, LeaseOwner(new_owner_id(), host, os.getpid())
