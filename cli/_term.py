"""Text bound for a terminal: untrusted characters made visible instead of obeyed.

Human output, progress lines and error paragraphs carry text from untrusted parties (a tool
result previewed by ``truss ledger show``, a tool name a model made up, a server's error
message). A terminal obeys control characters (ESC and C1 sequences can retitle the window,
rewrite earlier lines, or on some terminals answer back), and bidi overrides reorder what a
reader sees. Everything the CLI prints passes through here, so no single renderer has to
remember. It does not decide what is shown, only how unsafe characters look.
"""

from __future__ import annotations

__all__ = ["safe_human", "safe_json_text"]

_KEEP = frozenset("\n\t")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_human(text: str) -> str:
    """``text`` with every non-printable character except newline and tab shown as an escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in _KEEP else _escape(ch) for ch in text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # outside the BMP: JSON spells it as a UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def safe_json_text(text: str) -> str:
    """JSON text (from ``json.dumps``) with non-printable characters as ``\\u`` escapes (four hex digits).

    ``json.dumps`` already escapes C0 controls inside strings, so a raw non-printable character
    in its output is either layout (newline, indentation) or a character inside a string (C1
    controls, bidi overrides, line separators), where the escape means the same JSON value.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in _KEEP else _json_escape(ch) for ch in text)
