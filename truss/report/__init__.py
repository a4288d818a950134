"""The auditor's view of a session: a self-verifying HTML report, and each call's decision path.

- ``build_report`` (``page``): one HTML file holding a bundle's exact bytes, the keys to check it
  with, and a page that verifies it in the browser, offline (docs/report.md).
- ``explain_call`` / ``explain_calls`` (``why``): which allowlist, pin, policy rule, approval, budget
  and execution path decided a call, with the entries that record each (``truss ledger why``).

Sans-IO like the ledger core: bytes and entries in, text and values out. The page's HTML,
script and styles are package data under ``assets/``.
"""

from __future__ import annotations

from truss.report.page import ReportPage, build_report
from truss.report.why import CallExplanation, Step, call_ids, explain_call, explain_calls

__all__ = ["CallExplanation", "ReportPage", "Step", "build_report", "call_ids", "explain_call", "explain_calls"]
