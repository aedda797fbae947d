"""Slack as a channel: what it can do (`bot.channels.capabilities`) and how it writes an answer's text."""

from __future__ import annotations

from agents.address import Platform
from agents.markup.limits import split_text
from agents.markup.text import from_markdown
from bot.channels.capabilities import Capabilities, Channel


class SlackFormat:
    def posts(self, body: str) -> list[str]:
        return split_text(from_markdown(body))


SLACK = Channel(
    platform=Platform.SLACK,
    capabilities=Capabilities(
        reactions=True,
        typing=False,
        ai_status=True,
        file_shares=True,
        finds_posts=True,
        surveys=True,
        rich_answers=True,
        streaming=True,
    ),
    format=SlackFormat(),
)
