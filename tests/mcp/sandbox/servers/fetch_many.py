"""``fetch_many.py URL CAFILE COUNT``: COUNT HTTPS GETs, each on a new connection; prints each one's seconds.

The benchmark's client (bench/sandbox.py): run confined, its requests go through the relay and
the egress proxy (``HTTPS_PROXY``); run unconfined, straight to the server.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.request

url, cafile, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
context = ssl.create_default_context(cafile=cafile)
timings: list[float] = []
for _ in range(count):
    start = time.perf_counter()
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        response.read()
    timings.append(time.perf_counter() - start)
print(json.dumps(timings))
