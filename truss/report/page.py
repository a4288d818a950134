"""The self-verifying HTML report: one file holding a bundle, the keys to check it with, and the page.

``build_report(bundle, trusted)`` returns the HTML text. The page (``assets/report.html``,
``report.css``, ``report.js``) embeds the bundle's exact bytes (base64, so any bytes, even a bundle
that does not parse, are carried unchanged), the verifier keys it was told to trust, and the
decision path of each call (``truss.report.why``) bound to the bundle's session and head. In the
browser, offline, the script runs the bundle checks B1-B8 of docs/ledger-format.md over those
bytes and renders everything it shows from them, as text.

A strict Content-Security-Policy in the page forbids every fetch: scripts and styles only by the
hash of the inline ones built here, no images, fonts, frames, connections, forms or base URL.
Sans-IO: bytes and key texts in, text out; it does not verify the bundle itself (callers run
``truss.ledger.bundle.verify_bundle`` and say what it found) and writes no file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from truss._errors import BundleFormatError, TrussError
from truss.ledger.canonical import CanonicalError
from truss.ledger.entry import KINDS, StoredEntry
from truss.report.why import explain_calls

__all__ = ["CSP_DIRECTIVES", "ReportPage", "build_report"]

CSP_DIRECTIVES = (
    "default-src 'none'",
    "script-src {script}",
    "style-src {style}",
    "img-src 'none'",
    "font-src 'none'",
    "connect-src 'none'",
    "media-src 'none'",
    "object-src 'none'",
    "frame-src 'none'",
    "worker-src 'none'",
    "manifest-src 'none'",
    "form-action 'none'",
    "base-uri 'none'",
)
"""The page's Content-Security-Policy, one directive each; ``{script}``/``{style}`` become hashes."""

_MARKER = re.compile(r"@(CSP|TITLE|STYLE|CONFIG|BUNDLE|SCRIPT)@")


@dataclass(frozen=True)
class ReportPage:
    """The report's HTML and what went into it."""

    html: str
    session: str | None
    explained_calls: int

    @property
    def data(self) -> bytes:
        return self.html.encode("utf-8")


def _asset(name: str) -> str:
    return resources.files("truss.report").joinpath("assets", name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element: no '<', '>' or '&' that could end or open a tag."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _explanations(bundle: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """The session and, for a bundle that parses, the decision paths of its calls, bound to its head."""
    try:
        doc: Any = json.loads(bundle)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    typed: dict[str, Any] = doc  # pyright: ignore[reportUnknownVariableType]
    session = typed.get("session")
    items: Any = typed.get("entries")
    blobs: Any = typed.get("blobs")
    if not isinstance(session, str) or not isinstance(items, list) or not items or not isinstance(blobs, dict):
        return (session if isinstance(session, str) else None), None
    try:
        entries = [StoredEntry.from_json(item) for item in items]  # pyright: ignore[reportUnknownVariableType]
        pairs: dict[Any, Any] = blobs  # pyright: ignore[reportUnknownVariableType]
        held = {str(ref): base64.b64decode(str(data), validate=True) for ref, data in pairs.items()}
        paths = explain_calls(entries, held.get)
    except (TrussError, CanonicalError, binascii.Error, ValueError, TypeError, KeyError, AttributeError):
        # Whatever the bundle holds, the page still shows it and says where it does not verify; it
        # only goes without the decision paths.
        return session, None
    calls = {call: e.to_json() for call, e in paths.items()}
    return session, {"session": session, "head": entries[-1].hash, "calls": calls}


def build_report(bundle: bytes, trusted: Sequence[str], *, truss_version: str) -> ReportPage:
    """The HTML report of ``bundle`` (its exact bytes), checked in the page against ``trusted`` vkeys.

    ``trusted`` are verifier-key texts (``name+keyid+base64``) the caller has already parsed; the
    page lets its reader replace them. Raises ``BundleFormatError`` for a bundle too large to embed.
    """
    from truss.ledger.bundle import MAX_BUNDLE_BYTES

    if len(bundle) > MAX_BUNDLE_BYTES:
        raise BundleFormatError(
            f"a bundle is at most {MAX_BUNDLE_BYTES} bytes, this one is {len(bundle)}", reason="too_large"
        )
    session, derived = _explanations(bundle)
    config = {
        "trusted": list(trusted),
        "kinds": sorted(KINDS),
        "derived": derived,
        "truss_version": truss_version,
    }
    script = _asset("report.js")
    style = _asset("report.css")
    csp = "; ".join(CSP_DIRECTIVES).format(script=_csp_hash(script), style=_csp_hash(style))
    title = f"Truss report: session {session}" if session else "Truss report"
    encoded = base64.b64encode(bundle).decode("ascii")
    # 76-character lines keep the file friendly to editors and diff tools; the page strips them.
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))
    values = {
        "CSP": html.escape(csp, quote=True),
        "TITLE": html.escape(title, quote=True),
        "STYLE": style,
        "CONFIG": _script_json(config),
        "BUNDLE": wrapped,
        "SCRIPT": script,
    }
    # One pass over the template: text put in for one marker is never searched for another.
    page = _MARKER.sub(lambda m: values[m.group(1)], _asset("report.html"))
    return ReportPage(html=page, session=session, explained_calls=len(derived["calls"]) if derived else 0)
