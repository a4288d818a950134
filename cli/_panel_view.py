"""How ``truss ledger show`` prints a reviewer panel: claims, citations, findings and each reviewer's answer.

A ``verdict`` entry's panel checks already hold the panel's outcome (``truss.contract.panel``); a
``panel_review`` entry is shown with the answer its response payload holds, judgement by judgement,
when the payload is still stored. Text from the record (claims, reasons) is the model's and is shown
as text, cut to one line each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from truss._claims import submission_of

_LINE_CHARS = 160
_INDENT = " " * 6


def _one_line(value: Any) -> str:
    text = " ".join(str(value if value is not None else "").split())
    return text if len(text) <= _LINE_CHARS else text[:_LINE_CHARS] + "..."


def _cites(cites: Any) -> str:
    listed = [str(c) for c in cast(list[Any], cites)] if isinstance(cites, list) else []
    return "cites " + ", ".join(listed) if listed else "cites nothing"


def verdict_lines(body: Mapping[str, Any]) -> list[str]:
    """The panel checks of a ``verdict`` entry body, as indented lines."""
    lines: list[str] = []
    checks: Any = body.get("checks")
    for raw in cast(list[Any], checks) if isinstance(checks, list) else []:
        check = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        panel: Any = check.get("panel")
        if not isinstance(panel, dict):
            continue
        p = cast(dict[str, Any], panel)
        lines.append(
            f"{_INDENT}panel (check {check.get('index')}): {p.get('outcome')}, {_one_line(check.get('detail'))}"
        )
        for claim in cast(list[Any], p.get("claims") or []):
            c = cast(dict[str, Any], claim) if isinstance(claim, dict) else {}
            lines.append(f"{_INDENT}  claim {c.get('claim')}: {_one_line(c.get('text'))!r} {_cites(c.get('cites'))}")
        for cited in cast(list[Any], p.get("cited") or []):
            c = cast(dict[str, Any], cited) if isinstance(cited, dict) else {}
            digest = str(c.get("hash") or "")[:12]
            lines.append(f"{_INDENT}  cited {c.get('call')} {c.get('tool')} {c.get('status')}: "
                         f"{c.get('kind')} seq {c.get('seq')} {digest}...")  # fmt: skip
        for finding in cast(list[Any], p.get("findings") or []):
            f = cast(dict[str, Any], finding) if isinstance(finding, dict) else {}
            lines.append(f"{_INDENT}  finding {f.get('finding')}: {_one_line(f.get('detail'))}")
        for reviewer in cast(list[Any], p.get("reviewers") or []):
            r = cast(dict[str, Any], reviewer) if isinstance(reviewer, dict) else {}
            who = f"{r.get('name')} ({r.get('provider')}{' ' + str(r['model']) if r.get('model') else ''})"
            cause = f" ({r.get('cause')})" if r.get("cause") else ""
            lines.append(f"{_INDENT}  reviewer {who}: {r.get('outcome')}{cause}: {_one_line(r.get('reason'))}")
    return lines


def review_view(body: Mapping[str, Any], blob: Callable[[str], bytes | None]) -> tuple[dict[str, Any], list[str]]:
    """A ``panel_review`` entry: its outcome and, when the response is stored, the submitted judgements."""
    model = f" {body.get('model')}" if body.get("model") else ""
    head = (f"{_INDENT}review by {body.get('name')} ({body.get('provider')}{model}) of check {body.get('check')}: "
            f"{body.get('outcome')}: {_one_line(body.get('reason'))}")  # fmt: skip
    view: dict[str, Any] = {"outcome": body.get("outcome"), "reason": body.get("reason")}
    lines = [head]
    ref = body.get("response")
    data = blob(ref) if isinstance(ref, str) else None
    if data is None:
        return view, lines
    try:
        response: Any = json.loads(data)
    except ValueError:
        return view, lines
    form, problem = submission_of(response)
    if problem is not None or not isinstance(form, dict):
        return view, lines
    view["form"] = form
    claims: Any = cast(dict[str, Any], form).get("claims")
    for raw in cast(list[Any], claims) if isinstance(claims, list) else []:
        item = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        relied: Any = item.get("calls")
        calls = ", ".join(str(c) for c in cast(list[Any], relied)) if isinstance(relied, list) else ""
        reason = f": {_one_line(item.get('reason'))}" if item.get("reason") else ""
        lines.append(f"{_INDENT}  claim {item.get('claim')} {item.get('judgement')} [{calls}]{reason}")
    return view, lines
