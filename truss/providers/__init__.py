"""Model providers: scripted (offline default), anthropic, openai (chat-completions compatible)."""

from __future__ import annotations

__all__: list[str] = []
