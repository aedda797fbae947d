"""Where a conversation lives, as one typed value: the one place that builds and reads a conversation's key.

A conversation is a thread of a channel of a workspace on a platform (Slack today), or a whole direct-message
channel, which is answered without threads. The database stores the key string (`platform:workspace:channel:
thread`, `dm` for a direct message); every edge builds it with `Address` and reads it back with `parse`.
"""

from __future__ import annotations

from dataclasses import dataclass

DM = "dm"


def _like_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True)
class Address:
    platform: str
    """"slack" (a second platform is a new value here and a new edge, not edits across the code)."""
    workspace: str
    channel: str
    thread: str | None
    """The thread's root id; None for a direct message (one conversation per channel, no threads)."""

    @property
    def key(self) -> str:
        return f"{self.platform}:{self.workspace}:{self.channel}:{self.thread or DM}"

    @property
    def is_dm(self) -> bool:
        return self.thread is None

    @classmethod
    def parse(cls, key: str) -> Address | None:
        """The address of a stored key; None for keys that are no platform's (the terminal chat's, tests')."""
        parts = key.split(":")
        if len(parts) != 4 or not all(parts):
            return None
        platform, workspace, channel, thread = parts
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
        return ":".join("%" if part is None else _like_literal(part) for part in parts)
