"""Witnessing at the edges: submitting checkpoints to C2SP witnesses, and being one.

- ``config``: the operator's witness settings (``$TRUSS_HOME/witness.toml`` naming a tlog-policy
  file with the witnesses' keys and URLs, the throttle, timeouts and retries);
- ``client``: one witness over HTTP (``add-checkpoint``, 409 re-proving, bounded retries);
- ``submit``: a signed checkpoint to every witness of the policy, cosignatures kept with the
  checkpoint, one ``checkpoint_witnessed`` entry per witness; the session-end hook;
- ``server``: ``truss witness serve``, a witness of its own (key, followed logs, state).

The protocol itself (request and response bytes, the witness's decision, cosignatures,
policies) is sans-IO in ``truss.ledger`` (``witness``, ``cosignature``, ``tlog_policy``). Nothing
here is imported unless witnessing is configured or a witness command runs.
"""
