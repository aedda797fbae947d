"""What the outbox's sender needs of a chat platform: a few calls, and one way of saying "refused".

The sender (`bot.delivery.sender.OutboxSender`) owns the policy (order, leases, attempts, backoff, give-ups,
exactly-once); a `Messenger` only makes a platform's API calls: `bot.slack.messenger` for Slack's Web API,
`bot.teams.messenger` for the Bot Connector. A messenger raises `Refused` when the platform answered that it did not
do the call (so trying again can post nothing twice); any other exception means the outcome is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

from agents.address import Platform
from agents.attachments import FileRef
from escalation.views import Message


class Where(NamedTuple):
    channel: str
    thread: str | None
    """The thread's root (Slack ts, Teams reply chain's root id); None: the channel or chat itself."""


class Refused(Exception):
    """The platform answered, and did not do the call. `error` is in Slack's vocabulary (`ratelimited`,
    `channel_not_found`, `invalid_blocks`, ...), which every messenger maps its answers to, so that one policy
    decides for both platforms."""

    def __init__(self, error: str, *, retry_after: float | None = None, certain: bool = True) -> None:
        super().__init__(error)
        self.error = error
        self.retry_after = retry_after
        self.certain = certain
        """False for an answer that does not rule out that the call was done (Slack's `internal_error`): a post
        refused so stays in doubt, and is looked for before it is tried again."""


class Messenger(Protocol):
    platform: Platform

    async def post(self, where: Where, message: Message, *, outbox_id: int) -> str:
        """Post; returns the new message's id."""
        ...

    async def find(self, where: Where, *, outbox_id: int, since: datetime) -> str | None:
        """The id of the post carrying `outbox_id`, if the platform has it (only called where the channel
        `finds_posts`)."""
        ...

    async def update(self, where: Where, message_id: str, message: Message) -> None:
        """Change a message, which is in `where` (its thread: None for a message that is its own thread's root)."""
        ...

    async def delete(self, where: Where, message_id: str) -> None: ...

    async def react(self, channel: str, message_id: str, name: str, *, add: bool) -> None: ...

    async def typing(self, where: Where) -> None:
        """Show that the bot is working on an answer (Teams' typing indicator; nothing on Slack, which reacts)."""
        ...

    async def notice(self, where: Where, user: str, text: str) -> None:
        """A message only `user` sees, where the platform has them (else a short one in the thread)."""
        ...

    async def direct(self, user: str, text: str) -> None:
        """A direct message to a person (the admins' alerts)."""
        ...


@runtime_checkable
class FileSharing(Protocol):
    """A platform the bot can share files into (Slack): files are uploaded first, then shared in one message with
    a comment. Another platform gets the comment and the files' names as a post instead."""

    async def upload(self, name: str, data: bytes) -> str:
        """Upload a file, shared nowhere yet; returns its id."""
        ...

    async def share(self, where: Where, file_ids: list[str], comment: str) -> str | None:
        """Share uploaded files in one message; the message's id when the platform says it already."""
        ...

    async def find_share(self, where: Where, file_ids: list[str]) -> str | None:
        """The message that shares these files in `where`, if there is one (after an unknown outcome)."""
        ...

    async def delete_file(self, file_id: str) -> None:
        """Delete a file the bot uploaded (a forgotten person's); one already gone counts as deleted."""
        ...


class FileFetcher(Protocol):
    """Reads a channel's files again (Slack's), so that a file relay can share them in another message."""

    @property
    def max_bytes(self) -> int:
        """Larger files are not fetched."""
        ...

    def too_big(self, ref: FileRef) -> bool:
        """Larger than `max_bytes`, as the platform declared it."""
        ...

    async def fetch(self, ref: FileRef) -> bytes | None:
        """The file's bytes; None when it turns out larger than `max_bytes`. Raises `Unreadable`
        (`agents.knowledge.readers`) when the platform does not give it, anything else when the download fails."""
        ...


@dataclass(frozen=True)
class PreviewRef:
    """An open preview (`agents.db.models.Preview`) as the sender hands it to the channel that finishes it."""

    id: int
    platform: str
    channel: str
    thread: str | None
    stream_id: str | None
    """The streamed message's id (Slack's ts, Teams' streamId); None: the start's outcome is unknown."""
    shown: str
    """What the stream has shown: a finisher replaces the text only where it differs."""
    started_at: datetime
    shown_at: datetime | None = None
    """When the stream last showed something (the platform may want a pause before the next activity)."""


@runtime_checkable
class Previewing(Protocol):
    """A channel that shows answers while they are written (`Capabilities.streaming`): the outbox finishes the open
    preview with the next message it owes the customer's thread, in place, instead of posting that message."""

    async def finish_preview(self, preview: PreviewRef, where: Where, message: Message, *, outbox_id: int) -> str:
        """Make the preview's message `message` (with the outbox id, as a post carries it); returns the message's
        id. Raises `Refused` or anything else as a post does: the sender then decides as for a post."""
        ...
