"""``fetch.py URL CAFILE``: an ordinary HTTPS client (urllib, which honours HTTPS_PROXY); prints the body."""

from __future__ import annotations

import ssl
import sys
import urllib.request

context = ssl.create_default_context(cafile=sys.argv[2])
with urllib.request.urlopen(sys.argv[1], context=context, timeout=10) as response:
    sys.stdout.write(response.read().decode())
