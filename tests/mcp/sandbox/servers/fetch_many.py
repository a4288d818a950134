"""``fetch_many.py URL CAFILE``: the benchmark's HTTPS client (bench/sandbox.py), driven over stdin.

Each line ``N`` on stdin makes N GETs, each on a new connection, and answers one line: the JSON
list of their durations in seconds. Run confined, its requests go through the egress proxy
(``HTTPS_PROXY``); run unconfined, straight to the server. Staying alive between batches lets
the benchmark interleave small batches of both, so that both see the same machine load.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.request

url, cafile = sys.argv[1], sys.argv[2]
context = ssl.create_default_context(cafile=cafile)
for line in sys.stdin:
    timings: list[float] = []
    for _ in range(int(line)):
        start = time.perf_counter()
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            response.read()
        timings.append(time.perf_counter() - start)
    sys.stdout.write(json.dumps(timings) + "\n")
    sys.stdout.flush()
