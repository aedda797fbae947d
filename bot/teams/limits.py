"""What a Teams message holds, and Teams Markdown clipped or split to fit it.

Teams measures a message as its whole JSON payload encoded as UTF-16 and refuses one that is too big with 413
`MessageSizeTooBig`. The documented limit has moved (28 KB for incoming webhooks and 40 KB for a bot message in
"Text formatting in cards"; 40 KB, later 100 KB with 80 KB advised, in "Format your bot messages",
learn.microsoft.com/microsoftteams/platform/bots/how-to/format-your-bot-messages), so we keep to the smallest:
28 KB, with room for the activity around the card or the text.

A cut never falls inside a Markdown link, a code span, an entity or a backslash escape (the piece left would show
as broken syntax, or turn what follows into a link), and a code fence cut open is closed again.
"""

from __future__ import annotations

import re

MESSAGE_BYTES = 28 * 1024
"""A whole message, in UTF-16 bytes."""
CARD_BYTES = MESSAGE_BYTES - 4 * 1024
"""An Adaptive Card attachment: the message less room for the activity's other fields (ids, names, text)."""
POST_TEXT = 4_000
"""One post of a long answer, in characters: readable, and under 28 KB even if every character took 4 bytes."""
ELLIPSIS = "…"
_FENCE = "```"
_ATOMIC = re.compile(
    r"\\.|\[(?:\\.|[^\[\]\\\n])*\]\((?:[^()\s]|\([^()\s]*\))*\)|`[^`\n]+`|&(?:#\d+|#x[0-9a-f]+|\w+);", re.IGNORECASE
)
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)


def utf16_bytes(text: str) -> int:
    """What Teams counts for `text`."""
    return len(text.encode("utf-16-le"))


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word when one ends near the limit and marked with an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: _safe_cut(text, limit - len(ELLIPSIS))]
    if head.count(_FENCE) % 2:  # an open fence would make the ellipsis code, and every later message too
        head = text[: _safe_cut(text, limit - len(ELLIPSIS) - len(_FENCE) - 1)].rstrip()
        return head + ELLIPSIS + ("\n" + _FENCE if head.count(_FENCE) % 2 else "")
    word = head.rfind(" ")
    return (head[:word] if word > len(head) * 3 // 4 else head).rstrip() + ELLIPSIS


def split_text(text: str, limit: int = POST_TEXT) -> list[str]:
    """Posts of at most `limit` characters (a fence cut open adds its closing line), split at a paragraph, else a
    line, else a word, outside code fences where one is far enough in; a fence longer than a post is closed and
    opened again around the cut."""
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        cut = _split_at(rest, limit)
        head, rest = rest[:cut].rstrip(), rest[cut:]
        rest = rest.lstrip("\n") if rest.startswith("\n") else rest.lstrip(" ")
        if head.count(_FENCE) % 2:
            head, rest = head + "\n" + _FENCE, _FENCE + "\n" + rest
        parts.append(head)
    if rest:
        parts.append(rest)
    return parts


def _split_at(text: str, limit: int) -> int:
    atoms = _spans(_ATOMIC, text, limit)
    fences = _spans(_FENCED, text, limit)
    for outside in (True, False):
        for sep in ("\n\n", "\n", " "):
            at = text.rfind(sep, 0, limit)
            while at >= limit // 2:
                if _within(atoms, at) is None and not (outside and _within(fences, at) is not None):
                    return at
                at = text.rfind(sep, 0, at)
    return _safe_cut(text, limit) or limit


def _safe_cut(text: str, at: int) -> int:
    """`at`, or the start of the link, code span, entity or escape that `at` falls inside."""
    start = _within(_spans(_ATOMIC, text, at), at)
    return at if start is None else start


def _spans(pattern: re.Pattern[str], text: str, before: int) -> list[tuple[int, int]]:
    """Where `pattern` matches in `text`, the matches that start before `before`."""
    spans: list[tuple[int, int]] = []
    for match in pattern.finditer(text):
        if match.start() >= before:
            break
        spans.append(match.span())
    return spans


def _within(spans: list[tuple[int, int]], at: int) -> int | None:
    """The start of the span that `at` cuts in two, if any."""
    return next((start for start, end in spans if start < at < end), None)
