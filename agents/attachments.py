"""Files a customer attached to a message, as the engine sees them: the edge says where each file is
(`FileRef`, stored with the message), an `AttachmentReader` the host provides fetches and reads them before the
turn (`Attachment`), and `with_attachments` puts them into what the model sees.

What the transcript keeps is text only: each file's name and extracted text (clipped), or a line saying an image
was sent. Image bytes go to the model in the turn of the message that carried them and are not stored.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class FileRef:
    """One file of a message, as the platform described it when it was sent."""

    id: str
    name: str
    mime: str
    size: int | None
    """Bytes, as the platform said; None when it did not."""
    url: str
    """Where the host downloads it from (Slack's `url_private`)."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "mime": self.mime, "size": self.size, "url": self.url}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FileRef:
        return cls(str(raw["id"]), str(raw["name"]), str(raw["mime"]), raw.get("size"), str(raw["url"]))


@dataclass(frozen=True)
class Image:
    mime: str
    data: bytes

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True)
class Attachment:
    """A file read for the model: its text, an image it may look at, or neither (then `problem` says why)."""

    name: str
    mime: str
    text: str | None = None
    image: Image | None = None
    problem: str | None = None
    """Why it could not be read ("larger than 5 MB", "not a readable PDF"), or that it is an image not shown."""

    def as_text(self) -> str:
        """What the transcript keeps of it."""
        if self.text is not None:
            return f"[Attached file {self.name}]\n{self.text}"
        if self.image is not None or self.mime.startswith("image/"):
            seen = "" if self.image is not None else f" (the assistant cannot view images: {self.problem})"
            return f"[Image sent: {self.name} ({self.mime}){seen}]"
        return f"[Attached file {self.name} ({self.mime}): it could not be read: {self.problem}]"


class AttachmentReader(Protocol):
    async def read(self, files: Sequence[FileRef]) -> tuple[Attachment, ...]:
        """Every file as an Attachment, in order; a file that cannot be fetched or read is one with a `problem`,
        never an exception (the message is answered whatever became of its files)."""
        ...


def with_attachments(text: str, attachments: Sequence[Attachment]) -> str:
    """The message's text followed by what each attachment says, as the model and the transcript see it."""
    return "\n\n".join([t for t in (text, *(a.as_text() for a in attachments)) if t])


_PART = re.compile(r"\n\n(?=\[Attached file |\[Image sent: )")
_FILE_TEXT = re.compile(r"\[Attached file ([^\n]*)\]\n(?=.)", re.DOTALL)


def without_file_text(content: str) -> str:
    """A transcript message with what its files said taken out (a retention period ended, `bot.retention`): the
    message's own text stays, and each file is named, so the transcript still shows that one was sent. The parts are
    found as `with_attachments` joins them."""
    parts = _PART.split(content)
    return "\n\n".join(
        f"[Attached file {found[1]}: its text was erased after the retention period]"
        if (found := _FILE_TEXT.match(part))
        else part
        for part in parts
    )
