"""A "browser" for OAuth tests (set as BROWSER="python oauth_browser.py %s"): a person who always
approves. It opens the authorization URL, and follows each redirect as a browser would until it
lands on the loopback redirect URI, which it opens too. Exit 0 once the redirect was delivered.

With ``--forge-first`` it is also a hostile local process that gets there first: before following
the URL it sends the loopback redirect URI callbacks with a wrong state, with no state and with no
code, and exits 1 unless each was answered 400 (refused, and the listener still waiting)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

FORGED: tuple[dict[str, str], ...] = (
    {"code": "forged-code", "state": "forged-state"},
    {"code": "forged-code"},
    {"state": "forged-state", "error": "access_denied"},
    {},
)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def forge(url: str) -> int:
    redirect_uri = parse_qs(urlsplit(url).query)["redirect_uri"][0]
    for query in FORGED:
        try:
            with urllib.request.urlopen(f"{redirect_uri}?{urlencode(query)}", timeout=30) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        if status != 400:
            sys.stderr.write(f"oauth_browser: the forged callback {query} was answered {status}, not 400\n")
            return 1
    return 0


def main(url: str) -> int:
    opener = urllib.request.build_opener(_NoRedirect)
    for _ in range(10):
        try:
            with opener.open(url, timeout=30) as response:
                response.read()
                return 0 if "/callback" in url else 1
        except urllib.error.HTTPError as exc:
            if exc.code not in (301, 302, 303, 307, 308):
                sys.stderr.write(f"oauth_browser: {exc.code} from {url}\n")
                return 1
            url = urljoin(url, exc.headers["Location"])
    return 1


if __name__ == "__main__":
    if sys.argv[1] == "--forge-first":
        sys.exit(forge(sys.argv[2]) or main(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
