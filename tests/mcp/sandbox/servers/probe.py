"""``probe.py PORT``: what a process inside the sandbox sees; prints one JSON object.

Its environment's names, its network interfaces, whether it can reach a loopback port of the
host, and how many processes it can see.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def reach(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return "connected"
    except OSError as exc:
        return type(exc).__name__


with open("/proc/net/dev", encoding="ascii") as handle:
    interfaces = sorted(line.split(":", 1)[0].strip() for line in handle.readlines()[2:])
print(
    json.dumps(
        {
            "env": sorted(os.environ),
            "interfaces": interfaces,
            "reach": reach(int(sys.argv[1])),
            "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "hostname": socket.gethostname(),
            "uid": os.getuid(),
        }
    )
)
