"""A Block Kit message of ours as an Adaptive Card for Teams.

The block kinds our views send (escalation/views.py, bot/admin/views.py) map as follows: a header becomes a large
bold `TextBlock`; a section's text a `TextBlock` and its fields a `ColumnSet` two to a row, as Slack lays them out; a
context a small subtle `TextBlock`; a divider a separator above what follows; the buttons of every actions block the
card's `Action.Submit`s, whose `data` the click brings back (`helpdesk_action`, `value`). Texts are Slack mrkdwn
carried over by `bot.teams.text.from_mrkdwn`, with `wrap` so that none is cut at one line.

A TextBlock renders only bold, italic, lists and links, and breaks a line only at a blank line outside a list
("Text formatting in cards", learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/cards-format),
so a line break becomes a blank line. The card is kept under `limits.CARD_BYTES` by
clipping its longest texts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from bot.teams.emoji import emojize
from bot.teams.limits import CARD_BYTES, ELLIPSIS, clip, utf16_bytes
from bot.teams.text import escape, from_mrkdwn, unslack

CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
VERSION = "1.5"
ACTION_KEY = "helpdesk_action"
"""The key of a button's `data` that names the action (a Block Kit `action_id`)."""
VALUE_KEY = "value"
STYLES = {"primary": "positive", "danger": "destructive"}
FALLBACK_TEXT = 1_000
"""Characters of `fallbackText`, what a client that cannot show the card shows instead."""
_LINE_BREAKS = re.compile(r"\n+")


def adaptive_card(
    blocks: list[dict[str, Any]], *, fallback: str, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The attachment for a message of `blocks` whose Slack text (mrkdwn) is `fallback`; `names` as for
    `from_mrkdwn`. A new dict; `blocks` is not changed."""
    body: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    separate = False
    for block in blocks:
        kind = block.get("type")
        if kind == "divider":
            separate = bool(body)
            continue
        if kind == "actions":
            actions += [_action(e) for e in block.get("elements", []) if e.get("type") == "button"]
            continue
        element = _element(block, names or {})
        if element is None:
            continue
        if separate:
            element |= {"separator": True, "spacing": "Medium"}
            separate = False
        body.append(element)
    content: dict[str, Any] = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": VERSION,
        "msteams": {"width": "Full"},
        "fallbackText": clip(_card_safe(from_mrkdwn(fallback, names=names)), FALLBACK_TEXT),
        "body": body,
        "actions": actions,
    }
    _fit(content)
    return {"contentType": CONTENT_TYPE, "content": content}


def card_text(mrkdwn: str, names: Mapping[str, str] | None = None) -> str:
    """Slack mrkdwn as a TextBlock's text. A TextBlock shows code as plain text, so the `<` and `>` that `from_mrkdwn`
    keeps in code become entities here too (no `<at>` in a card, even without a mention entity to give it meaning).
    Slack has no list syntax (and `from_mrkdwn` escapes a typed one), so every line break is one that a TextBlock
    shows only as a blank line."""
    return _LINE_BREAKS.sub("\n\n", _card_safe(from_mrkdwn(mrkdwn, names=names)))


def _card_safe(markdown: str) -> str:
    return markdown.replace("<", "&lt;").replace(">", "&gt;")


def _element(block: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any] | None:
    match block.get("type"):
        case "header":
            return _text_block(_plain(block["text"]), size="Large", weight="Bolder")
        case "section":
            return _section(block, names)
        case "context":
            texts = [_object_text(e, names) for e in block.get("elements", []) if e.get("type") != "image"]
            return _text_block("  ".join(texts), size="Small", isSubtle=True) if texts else None
    return None


def _section(block: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any] | None:
    items: list[dict[str, Any]] = []
    if "text" in block:
        items.append(_text_block(_object_text(block["text"], names)))
    fields = [_object_text(f, names) for f in block.get("fields", [])]
    for row in range(0, len(fields), 2):
        columns = [{"type": "Column", "width": "stretch", "items": [_text_block(f)]} for f in fields[row : row + 2]]
        items.append({"type": "ColumnSet", "columns": columns})
    if len(items) > 1:
        return {"type": "Container", "items": items}
    return items[0] if items else None


def _object_text(obj: dict[str, Any], names: Mapping[str, str]) -> str:
    return card_text(obj.get("text", ""), names) if obj.get("type") == "mrkdwn" else _plain(obj)


def _plain(obj: dict[str, Any]) -> str:
    """A Block Kit plain_text object's text: Slack shows its entities decoded and, with `emoji`, its codes as
    emoji."""
    return escape(emojize(unslack(obj.get("text", ""))))


def _text_block(text: str, **style: Any) -> dict[str, Any]:
    return {"type": "TextBlock", "text": text, "wrap": True, **style}


def _action(button: dict[str, Any]) -> dict[str, Any]:
    action = {
        "type": "Action.Submit",
        "title": unslack(button["text"]["text"]),  # a button's title is plain text, never Markdown
        "data": {ACTION_KEY: button.get("action_id", ""), VALUE_KEY: button.get("value", "")},
    }
    if button.get("style") in STYLES:
        action["style"] = STYLES[button["style"]]
    return action


def _fit(content: dict[str, Any]) -> None:
    """Clip the longest text until the card is under `CARD_BYTES`; when every text is short, drop the last element
    of the body instead."""
    while (over := utf16_bytes(json.dumps(content, ensure_ascii=False)) - CARD_BYTES) > 0:
        blocks = list(_text_blocks(content["body"]))
        longest = max(blocks, key=lambda b: len(b["text"]), default=None)
        if longest is None or len(longest["text"]) <= 200:
            if not content["body"]:
                return
            content["body"].pop()
            continue
        # Each character is at least two bytes in UTF-16: cutting `over / 2` of them and a little more is enough.
        keep = max(len(longest["text"]) - over // 2 - len(ELLIPSIS) - 16, len(longest["text"]) // 2)
        longest["text"] = clip(longest["text"], keep)


def _text_blocks(elements: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for element in elements:
        if element["type"] == "TextBlock":
            yield element
        for child in element.get("items", []):
            yield from _text_blocks([child])
        for column in element.get("columns", []):
            yield from _text_blocks(column["items"])
