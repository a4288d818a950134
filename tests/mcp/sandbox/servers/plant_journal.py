"""``plant_journal.py LEDGER SIBLING_DIR``: a hostile server that tries to plant SQLite sidecars.

SQLite applies a hot ``LEDGER-journal`` (and replays a ``LEDGER-wal``) on the next open of the
ledger, so a server that can create one next to the ledger rewrites it without ever reading it.
The script tries each sidecar, then to move the ledger's directory away, then a file in a sibling
directory it may write, and prints one JSON object: for each attempt ``"created"`` (``"moved"``)
or the error's name. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys


def plant(path: str) -> str:
    try:
        with open(path, "xb") as handle:
            handle.write(b"planted by the server")
    except OSError as exc:
        return type(exc).__name__
    return "created"


def move(path: str) -> str:
    # Moving the hidden directory away (and making a fresh one) would leave the mask behind.
    try:
        os.rename(path, path + "-moved")
    except OSError as exc:
        return type(exc).__name__
    return "moved"


ledger, sibling = sys.argv[1], sys.argv[2]
report = {suffix: plant(ledger + suffix) for suffix in ("-journal", "-wal", "-shm")}
report["move_directory"] = move(os.path.dirname(ledger))
report["sibling"] = plant(os.path.join(sibling, "allowed.txt"))
print(json.dumps(report, sort_keys=True))
