"""TEMPORARY stand-in, replaced by the teamstext helper's package at merge."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any


def escape(text: str) -> str:
    return html.escape(text, quote=False)


def from_markdown(md: str) -> str:
    return escape(md)


def from_mrkdwn(text: str) -> str:
    text = html.unescape(text)
    text = re.sub(r"<([^|>]+)\|([^>]+)>", r"\2 (\1)", text)
    return escape(text)


def split_text(text: str, limit: int = 20_000) -> list[str]:
    return [text[i : i + limit] for i in range(0, max(len(text), 1), limit)]


def incoming_text(text: str, *, bot_names: Iterable[str] = ()) -> str:
    for name in bot_names:
        text = text.replace(f"<at>{name}</at>", "")
    text = re.sub(r"<[^>]+>", "", text)
    return html.unescape(text).strip()


def adaptive_card(blocks: list[dict[str, Any]], *, fallback: str) -> dict[str, Any]:
    body: list[dict[str, Any]] = [{"type": "TextBlock", "text": from_mrkdwn(fallback), "wrap": True}]
    actions: list[dict[str, Any]] = []
    for block in blocks:
        for element in block.get("elements", []) if block.get("type") == "actions" else []:
            actions.append(
                {
                    "type": "Action.Submit",
                    "title": element["text"]["text"],
                    "data": {"helpdesk_action": element["action_id"], "value": element.get("value")},
                }
            )
    return {
        "contentType": "application/vnd.microsoft.card.adaptive",
        "content": {"type": "AdaptiveCard", "version": "1.5", "body": body, "actions": actions},
    }
