"""What a log line concerns, carried in context variables so every layer's logs can name it: the conversation
(its key) and the inbound message being answered (its id), both set by the engine when a turn starts."""

from __future__ import annotations

from contextvars import ContextVar

current_conversation: ContextVar[str] = ContextVar("current_conversation", default="-")
current_message: ContextVar[int | None] = ContextVar("current_message", default=None)
