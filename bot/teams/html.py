"""What a person wrote, read back from the `text` of a Teams message activity.

Teams delivers a channel or group message as HTML (`<p>`, `<div>`, `<br>`, `<span>`, `&nbsp;` and other entities),
each mention as `<at>Name</at>` (the activity's `mention` entities say who; "Channel and group chat conversations
with a bot", learn.microsoft.com/microsoftteams/platform/bots/how-to/conversations/channel-and-group-conversations,
which also advises removing the bot's own mention), an emoji as an `<img>` whose `alt` is the emoji, and a link as
`<a href>` whose text its writer chose. A personal chat usually arrives as plain text. Both become the plain text the
person wrote: the bot's own mention removed, any other as `@Name`, blocks and line breaks as newlines, a link whose
text is not its address as `text (address)`, every other tag dropped and every entity decoded.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from html.parser import HTMLParser

_HTML = re.compile(r"<(?:p|div|br|span|ul|ol|li|pre|blockquote|h[1-6]|table)\b", re.IGNORECASE)
"""What marks `text` as HTML, whose whitespace is layout: a plain text may hold an `<at>` and still keep its lines."""
_BLOCKS = frozenset({"p", "div", "ul", "ol", "pre", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "table", "tr"})
_SCHEME = re.compile(r"^(?:https?://|mailto:)", re.IGNORECASE)
_SPACE = re.compile(r"[ \t\r\n\f]+")
_REMOVED = "\x00"
"""Where the bot's mention was: it and the spaces around it become one space."""


def incoming_text(html_or_text: str, *, bot_names: Collection[str]) -> str:
    """The text of a message activity as its writer typed it, without the mention of the bot (`bot_names`: its
    names as mentions show it)."""
    reader = _Reader(bot_names={_key(n) for n in bot_names}, html=bool(_HTML.search(html_or_text)))
    reader.feed(html_or_text.replace(_REMOVED, ""))
    reader.close()
    return _tidy("".join(reader.parts), html=reader.html)


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


def _tidy(text: str, *, html: bool) -> str:
    text = re.sub(f" *{_REMOVED} *", " ", text.replace("\xa0", " "))
    lines = text.split("\n")
    if html:  # HTML's own line breaks and indentation are layout, not the writer's (code indentation goes too)
        lines = [" ".join(line.split()) for line in lines]
    text = "\n".join(line.rstrip() for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class _Reader(HTMLParser):
    def __init__(self, *, bot_names: set[str], html: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.bot_names = bot_names
        self.html = html
        self.parts: list[str] = []
        self.mention: list[str] | None = None
        """The text of the `<at>` being read."""
        self.links: list[tuple[str, int]] = []
        """The open `<a>`s: their address and where their text starts in `parts`."""
        self.pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        match tag:
            case "at":
                self.mention = []
            case "br":
                self.parts.append("\n")
            case "li":
                self.block()
                self.parts.append("- ")
            case "a":
                self.links.append((attr.get("href") or "", len(self.parts)))
            case "img":
                self.parts.append(attr.get("alt") or "")
            case "pre":
                self.pre += 1
                self.block()
            case _ if tag in _BLOCKS:
                self.block()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag in ("at", "a"):
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        match tag:
            case "at" if self.mention is not None:
                name = " ".join("".join(self.mention).split())
                self.mention = None
                self.parts.append(_REMOVED if _key(name) in self.bot_names else "@" + name)
            case "a" if self.links:
                href, start = self.links.pop()
                shown = "".join(self.parts[start:]).strip()
                if _SCHEME.match(href) and shown not in (href, _SCHEME.sub("", href)):
                    self.parts.append(f" ({href})" if shown else href)
            case "pre":
                self.pre = max(0, self.pre - 1)
                self.block()
            case _ if tag in _BLOCKS:
                self.block()

    def block(self) -> None:
        """A paragraph, list item or other block starts or ends: a new line, unless one just started (`<div><p>`
        is one break, not two; a `<br>` always is one)."""
        for part in reversed(self.parts):
            if text := part.rstrip(" "):
                if not text.endswith("\n"):
                    self.parts.append("\n")
                return

    def handle_data(self, data: str) -> None:
        if self.mention is not None:
            self.mention.append(data)
        elif self.html and not self.pre:
            self.parts.append(_SPACE.sub(" ", data))
        else:
            self.parts.append(data)
