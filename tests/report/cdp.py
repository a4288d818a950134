"""A headless Chromium driven over its DevTools protocol, for the report's browser tests and benchmark.

``--remote-debugging-pipe`` needs no websocket: the browser reads NUL-terminated JSON messages on
its fd 3 and writes its own on fd 4. ``Browser`` starts Debian's ``chromium`` with a fresh profile
and the flags that keep it off the network on its own account, and ``Page`` is one tab attached in
flat mode: it records every ``Network.requestWillBeSent`` so a test can assert what the page asked
for. Every wait is bounded: a reply or an event that does not come within its timeout raises
``TimeoutError``; the browser is killed on close if it does not exit by itself.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Browser", "CdpError", "Page", "find_chromium"]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]


_TRAMPOLINE = (
    "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
    "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
)


class CdpError(Exception):
    """The browser answered a command with an error."""


def _high(fd: int) -> int:
    """``fd`` moved to a descriptor number of 10 or more (the original is closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def find_chromium() -> str | None:
    """Debian's ``chromium`` (or a ``chromium-browser``/``google-chrome`` on the PATH), else None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless browser process; ``page()`` opens a tab. Use as a context manager."""

    def __init__(self, executable: str, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="truss-chromium-")
        to_browser_r, self._write_fd = (_high(fd) for fd in os.pipe())
        self._read_fd, from_browser_w = (_high(fd) for fd in os.pipe())
        # A small trampoline puts the two pipe ends on fds 3 and 4, where --remote-debugging-pipe expects
        # them (both start at 10 or above, so neither move overwrites the other), then becomes the browser.
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _TRAMPOLINE,
                str(to_browser_r),
                str(from_browser_w),
                executable,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError, TimeoutError, EOFError, CdpError):
                self.call("Browser.close", timeout=10)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        for fd in (self._write_fd, self._read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- the protocol ------------------------------------------------------------------------------

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode("utf-8") + b"\0"
        while data:
            written = os.write(self._write_fd, data)
            data = data[written:]
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the browser did not answer in time")
            ready, _, _ = select.select([self._read_fd], [], [], left)
            if ready:
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    raise EOFError("the browser closed its DevTools pipe")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        value: dict[str, Any] = json.loads(message)
        return value

    def wait_for(self, match: Callable[[dict[str, Any]], bool], *, timeout: float | None = None) -> dict[str, Any]:
        """The first message (reply or event, already received or arriving) that ``match`` accepts."""
        for i, event in enumerate(self.events):
            if match(event):
                return self.events.pop(i)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            message = self._receive(deadline)
            if match(message):
                return message
            if "method" in message:
                self.events.append(message)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        request = self.send(method, params, session)
        reply = self.wait_for(lambda m: m.get("id") == request, timeout=timeout)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def page(self, *, width: int = 1280, height: int = 900) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        page.call("Page.enable")
        page.call("Page.setLifecycleEventsEnabled", {"enabled": True})
        page.call("Network.enable")
        page.call("Runtime.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page


class Page:
    """One tab: navigate, evaluate, screenshot, and the requests it made."""

    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        return self.browser.call(method, params, self.session, timeout=timeout)

    def open(self, url: str, *, timeout: float | None = None) -> None:
        """Navigate and wait for *this* document's load (matched by loader id, not any load event)."""
        loader = self.call("Page.navigate", {"url": url})["loaderId"]

        def loaded(message: dict[str, Any]) -> bool:
            params = message.get("params", {})
            return (
                message.get("method") == "Page.lifecycleEvent"
                and message.get("sessionId") == self.session
                and params.get("name") == "load"
                and params.get("loaderId") == loader
            )

        self.browser.wait_for(loaded, timeout=timeout)

    def evaluate(self, expression: str, *, timeout: float | None = None) -> Any:
        """The value of ``expression`` (awaited when it is a promise), or raise with the page's exception."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise CdpError(f"the page threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def set_file(self, selector: str, path: Path) -> None:
        """Choose ``path`` in the file input ``selector``, as a person would with the file dialog."""
        document = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", {"nodeId": document, "selector": selector})["nodeId"]
        self.call("DOM.setFileInputFiles", {"files": [str(path)], "nodeId": node})

    def screenshot(self, path: Path, *, full_height: int | None = None) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_height is not None:
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": 1280, "height": full_height, "scale": 1}
            )
        data = self.call("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def requests(self) -> list[str]:
        """The URL of every request the page made since it was opened (``Network.requestWillBeSent``)."""
        urls: list[str] = []
        for event in self.browser.events:
            if event.get("method") == "Network.requestWillBeSent" and event.get("sessionId") == self.session:
                urls.append(str(event["params"]["request"]["url"]))
        return urls

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})
