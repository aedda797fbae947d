"""Where a conversation lives, as one typed value: the one place that builds and reads a conversation's key.

A conversation is a thread of a channel of a workspace on a platform (a Slack thread, in a channel or a DM; a Teams
reply chain), or a whole chat without threads (a Teams personal or group chat), which is answered in the chat. The
database stores the key string (`platform:workspace:channel:thread`, `dm` for a direct message); every edge builds
it with `Address` and reads it back with `parse`. Parts are stored with `%` and `:` percent-encoded, since Teams ids
contain colons (`19:abc@thread.tacv2`, `a:1x2`); Slack's ids have neither, so their keys read as they always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DM = "dm"


class Platform(StrEnum):
    """Where people write: each value is a channel, a folder of its own (bot/slack/, bot/teams/)."""

    SLACK = "slack"
    TEAMS = "teams"


def is_teams_id(value: str) -> bool:
    """A Teams id (users `29:…`, `8:orgid:…`; conversations `19:…`, `a:…`), as opposed to a Slack one: Teams' ids
    all hold a colon, Slack's never do. How a mixed set-up (customers on one platform, staff on the other) tells
    whose an id is."""
    return ":" in value


def _encode(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A")


def _decode(part: str) -> str:
    return part.replace("%3A", ":").replace("%25", "%")


def _like_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True)
class Address:
    platform: str
    """A `Platform` value (or another word for keys that are no platform's, such as the terminal chat's)."""
    workspace: str
    channel: str
    thread: str | None
    """The thread's root id; None for a chat without threads (one conversation per chat)."""

    @property
    def key(self) -> str:
        parts = (self.platform, self.workspace, self.channel, self.thread or DM)
        return ":".join(_encode(part) for part in parts)

    @property
    def is_dm(self) -> bool:
        return self.thread is None

    @classmethod
    def parse(cls, key: str) -> Address | None:
        """The address of a stored key; None for keys that are no platform's (the terminal chat's, tests')."""
        parts = key.split(":")
        if len(parts) != 4 or not all(parts):
            return None
        platform, workspace, channel, thread = (_decode(part) for part in parts)
        return cls(platform, workspace, channel, None if thread == DM else thread)

    @staticmethod
    def channel_sql(key: str) -> str:
        """SQL for the channel part of the key in the SQL expression `key` (`platform:workspace:channel`), NULL
        for keys that are no platform's: what conversations of one channel share."""
        return f"substring({key} from '^([^:]+:[^:]+:[^:]+):[^:]+$')"

    @staticmethod
    def like(
        platform: str, *, workspace: str | None = None, channel: str | None = None, thread: str | None = None
    ) -> str:
        """A SQL LIKE pattern over keys: any workspace, channel or thread unless given (`thread=DM` for DMs)."""
        parts = [platform, workspace, channel, thread]
        return ":".join("%" if part is None else _like_literal(_encode(part)) for part in parts)
