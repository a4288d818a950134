"""A "browser" for OAuth tests (set as BROWSER="python oauth_browser.py %s"): a person who always
approves. It opens the authorization URL, and follows each redirect as a browser would until it
lands on the loopback redirect URI, which it opens too. Exit 0 once the redirect was delivered."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from urllib.parse import urljoin


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


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
    sys.exit(main(sys.argv[1]))
