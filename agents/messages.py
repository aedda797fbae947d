"""Transcript values: what the loop passes around, stores, and sends to the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agents.attachments import Image

Role = Literal["user", "assistant", "tool", "staff"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    """The provider's id for the call; a tool result answers it by this id."""
    name: str
    arguments: str
    """Raw JSON text as the model wrote it: it may be invalid, and is validated only when run."""

    @property
    def prepared(self) -> bool:
        """Made by the engine before the model's first call (passages, a look-up the message named), not by it."""
        return self.id.startswith(PREPARED)


PREPARED = "call_ready_"
"""Opens the id of a call the engine made for the model before its first call (agents.loop); stored with the
transcript, so the window knows those calls in earlier turns."""


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    agent: str | None = None
    """The agent that produced an assistant or tool message; None for the customer and staff."""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    """The tool's name, on tool results."""
    author: str | None = None
    """Who wrote a customer or staff message (the platform's user id), when known."""
    author_name: str | None = None
    """Their display name when the message was written, for `labelled` rendering."""
    images: tuple[Image, ...] = ()
    """Images a customer sent with it, for the model of this turn only: never stored (agents.attachments)."""

    def to_openai(self, *, labelled: bool = False) -> dict[str, Any]:
        """Chat Completions shape. Staff messages (issue: human takeover) read as attributed assistant text;
        `labelled` customer messages name their writer (a thread where several people write, see agents.window)."""
        if self.role == "staff":
            return {
                "role": "assistant",
                "content": f"[{self.author or 'Staff'} (human colleague)]: {self.content}",
            }
        if self.role == "tool":
            return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content or ""}
        if self.role == "assistant":
            # Providers take null content only beside tool calls.
            out: dict[str, Any] = {
                "role": "assistant",
                "content": self.content if self.tool_calls else self.content or "",
            }
            if self.tool_calls:
                out["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in self.tool_calls
                ]
            return out
        said = self.content or ""
        if labelled:
            said = f"[{self.author_name or self.author or 'Customer'}]: {said}"
        if self.images:
            parts = [{"type": "image_url", "image_url": {"url": image.data_url()}} for image in self.images]
            return {"role": "user", "content": [{"type": "text", "text": said}, *parts]}
        return {"role": "user", "content": said}


def message_from_json(raw: dict[str, Any]) -> Message:
    """A transcript row as the engine's statements read it (`to_jsonb` of a `messages` row)."""
    return Message(
        role=raw["role"],
        content=raw["content"],
        agent=raw["agent"],
        tool_calls=tuple(ToolCall(**c) for c in raw["tool_calls"] or ()),
        tool_call_id=raw["tool_call_id"],
        name=raw["name"],
        author=raw["author"],
        author_name=raw.get("author_name"),
    )


def estimate_tokens(text: str) -> int:
    """About four characters a token for English; tokenizers cannot be downloaded at run time here, and the
    window only needs a conservative bound, not an exact count."""
    return len(text) // 4 + 1
