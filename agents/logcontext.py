"""The conversation a log line concerns, carried in a context variable so every layer's logs can name it."""

from __future__ import annotations

from contextvars import ContextVar

current_conversation: ContextVar[str] = ContextVar("current_conversation", default="-")
