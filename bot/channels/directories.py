"""People and links for what escalation renders (`escalation.render.Directory`) over every channel: a case can show
one channel's customer to staff on another, and the renderer gets one object. The composition root registers each
channel's directory; since the renderer has ids alone, an id finds its directory by its shape (`owns`)."""

from __future__ import annotations

from typing import Protocol

from agents.address import Platform
from escalation.render import Directory
from escalation.views import Person


class ChannelDirectory(Directory, Protocol):
    def owns(self, value: str) -> bool:
        """Whether `value` (a person's or a conversation's id) has this channel's shape."""
        ...


class Directories:
    def __init__(self) -> None:
        self._by_platform: dict[Platform, ChannelDirectory] = {}

    def register(self, platform: Platform, directory: ChannelDirectory) -> None:
        self._by_platform[platform] = directory

    def _for(self, value: str) -> ChannelDirectory | None:
        registered = list(self._by_platform.values())
        # An id of a channel that is not configured (a conversation from before) is asked of one that is.
        fallback = registered[0] if registered else None
        return next((directory for directory in registered if directory.owns(value)), fallback)

    async def person(self, user: str) -> Person:
        directory = self._for(user)
        return Person(user) if directory is None else await directory.person(user)

    async def permalink(self, channel: str, message: str) -> str | None:
        directory = self._for(channel)
        return None if directory is None else await directory.permalink(channel, message)
