"""Microsoft Teams as a channel: what it can do (`bot.channels.capabilities`) and how it writes an answer's text."""

from __future__ import annotations

from agents.address import Platform
from bot.channels.capabilities import Capabilities, Channel
from bot.teams.limits import split_text
from bot.teams.text import from_markdown


class TeamsFormat:
    def posts(self, body: str) -> list[str]:
        return split_text(from_markdown(body))


TEAMS = Channel(
    platform=Platform.TEAMS,
    capabilities=Capabilities(
        reactions=False,  # a bot cannot react in Teams
        typing=True,
        ai_status=False,
        file_shares=False,
        finds_posts=False,  # the Bot Connector API reads no messages back
        surveys=False,
        rich_answers=False,
        streaming=True,  # in personal chats (bot.teams.streaming); channels and group chats keep typing
    ),
    format=TeamsFormat(),
)
