"""What Slack accepts in a message, and text and Block Kit clipped to fit it.

The limits are Slack's documented ones (docs.slack.dev, Block Kit reference: blocks, text object, button element;
chat.postMessage). Over a limit Slack refuses the whole message (`invalid_blocks`), so a case whose reason runs to a
page, or a customer with a 200-character name, would never reach staff: everything we send is clipped first, with
an ellipsis.
"""

from __future__ import annotations

from typing import Any

MESSAGE_TEXT = 40_000
"""A message's top-level `text`: Slack truncates longer ones."""
POST_TEXT = 3_900
"""One post of a long answer: Slack recommends staying under 4,000 characters a message."""
BLOCKS = 50
"""Blocks in one message."""
MARKDOWN_TEXT = 12_000
"""All markdown blocks of one message together."""
HEADER_TEXT = 150
"""A header block's plain_text."""
TEXT_OBJECT = 3_000
"""Any text object: a section's text, a context element."""
FIELD_TEXT = 2_000
"""One of a section's fields."""
FIELDS = 10
"""Fields in one section."""
CONTEXT_ELEMENTS = 10
ACTION_ELEMENTS = 25
BUTTON_TEXT = 75
ELLIPSIS = "…"
_FENCE = "```"


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word when one ends near the limit and marked with an ellipsis; never
    inside an entity (`&amp;`) or a link (`<url>`), and a code block cut open is closed again."""
    if len(text) <= limit:
        return text
    room = limit - len(ELLIPSIS)
    head = _safe_end(text[:room])
    close = ""
    if head.count(_FENCE) % 2:  # a fence left open would turn the ellipsis, and all after it, into code
        head = _safe_end(text[: room - len(_FENCE) - 1])
        close = "\n" + _FENCE if head.count(_FENCE) % 2 else ""
    word = head.rfind(" ")
    if not close and word > len(head) * 3 // 4:
        head = head[:word]
    return head.rstrip() + ELLIPSIS + close


def split_text(text: str, limit: int = POST_TEXT) -> list[str]:
    """Split at paragraph, then line, then word boundaries; a code fence cut in two is closed and reopened so
    both halves still render as code."""
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), window.rfind("\n"), window.rfind(" "))
        if cut < limit // 2:
            cut = len(_safe_end(window)) or limit
        head, rest = rest[:cut].rstrip(), rest[cut:].lstrip()
        if head.count(_FENCE) % 2 == 1:
            head, rest = head + "\n" + _FENCE, _FENCE + "\n" + rest
        parts.append(head)
    if rest:
        parts.append(rest)
    return parts


def fit(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks with every text and list of the block types we send clipped to Slack's limits (copies)."""
    return [_fit_block(block) for block in blocks[:BLOCKS]]


def _fit_block(block: dict[str, Any]) -> dict[str, Any]:
    fitted = dict(block)
    match block.get("type"):
        case "header":
            fitted["text"] = _fit_text(block["text"], HEADER_TEXT)
        case "markdown":  # one per message as we send them, so the block has the whole allowance
            fitted["text"] = clip(block["text"], MARKDOWN_TEXT)
        case "section":
            if "text" in block:
                fitted["text"] = _fit_text(block["text"], TEXT_OBJECT)
            if "fields" in block:
                fitted["fields"] = [_fit_text(f, FIELD_TEXT) for f in block["fields"][:FIELDS]]
        case "context":
            fitted["elements"] = [_fit_text(e, TEXT_OBJECT) for e in block["elements"][:CONTEXT_ELEMENTS]]
        case "actions":
            fitted["elements"] = [_fit_element(e) for e in block["elements"][:ACTION_ELEMENTS]]
    return fitted


def _fit_text(obj: dict[str, Any], limit: int) -> dict[str, Any]:
    return obj | {"text": clip(obj["text"], limit)} if "text" in obj and obj.get("type") != "image" else obj


def _fit_element(element: dict[str, Any]) -> dict[str, Any]:
    return element | {"text": _fit_text(element["text"], BUTTON_TEXT)} if element.get("type") == "button" else element


def _safe_end(head: str) -> str:
    """`head` without a trailing piece of an entity or of a link, which Slack would show broken (or, a `<` left
    open, parse together with what follows)."""
    amp = head.rfind("&")
    if amp != -1 and amp > len(head) - 5 and ";" not in head[amp:]:
        head = head[:amp]
    lt = head.rfind("<")
    if lt != -1 and ">" not in head[lt:]:
        head = head[:lt]
    return head
