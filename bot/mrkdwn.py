"""Model output (Markdown) to Slack mrkdwn, in pieces Slack accepts."""

from __future__ import annotations

from markdown_to_mrkdwn import SlackMarkdownConverter

# Slack truncates text over 40,000 characters and recommends staying under 4,000 per message.
SLACK_TEXT_LIMIT = 3_900
TEXT_LIMIT = 40_000
"""A message's `text` over this is truncated by Slack."""


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_mrkdwn(markdown: str) -> str:
    converted: str = SlackMarkdownConverter().convert(markdown)
    return converted.strip()


def split_text(text: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Split at paragraph, then line, then word boundaries; a code fence cut in two is closed and reopened so
    both halves still render as code."""
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), window.rfind("\n"), window.rfind(" "))
        if cut < limit // 2:
            cut = limit
        head, rest = rest[:cut].rstrip(), rest[cut:].lstrip()
        if head.count("```") % 2 == 1:
            head, rest = head + "\n```", "```\n" + rest
        parts.append(head)
    if rest:
        parts.append(rest)
    return parts
