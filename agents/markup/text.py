"""Whatever a customer, a colleague or a model writes stays text in Slack.

Slack parses `&`, `<` and `>` as control characters in message text and in every text object: `<!channel>`,
`<!here>`, `<!everyone>` and `<!subteam^S…>` notify, `<@U…>` mentions someone, `<#C…>` links a channel, and
`<url|label>` is a link whose label may name any other place. Text we do not control therefore has those three
escaped as `&amp;`, `&lt;` and `&gt;` before it enters any field (Slack's rule:
https://docs.slack.dev/messaging/formatting-message-text#escaping), and a link keeps working only in a form that
shows its real target.

Text that comes from Slack (customers' and colleagues' messages, as events deliver them) is already in Slack's
encoding: an `&amp;` there is an ampersand typed, and the `<…>` sequences are what the writer's client made of an
@-mention or a link. So `escape` keeps an entity that is already there and escapes only a bare `&`: the same
function serves Slack's text and a model's, and escaping twice changes nothing (a model writing `&amp;` literally
shows `&`, which is the price).

The words `@channel`, `@here` and `@everyone` typed as plain text notify nobody in a message posted through the Web
API: Slack makes mentions of them only when the call sets `link_names` (or `parse=full`), and no call of ours does
(chat.postMessage and chat.update in bot/delivery/sender.py, the /support answers through response_url), so they are
left as
written.

Slack's `markdown` block takes standard Markdown, which Slack renders itself (headings, lists, tables). What goes into
it is made inert the same way (`inert_markdown`): `&`, `<` and `>` as entities outside code, so no `<!here>` or
`<@U…>` works; every link, of either syntax, shown with its real target beside its label; and no reference-style
link definitions, whose labels could name any place.
"""

from __future__ import annotations

import re

from markdown_to_mrkdwn import SlackMarkdownConverter

_CONTROL = re.compile(r"&(?:amp|lt|gt);|[&<>]")
_ENTITY = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
_LINK = re.compile(r"<((?:https?://|mailto:)[^\s<>|]+)(?:\|([^<>]*))?>")
_SCHEME = re.compile(r"^(?:https?://|mailto:)")
_MD_LINK = re.compile(
    r"!?\[([^\]\n]*)\]\(\s*<?([^()\s<>]*(?:\([^()\s<>]*\)[^()\s<>]*)*)>?(?:\s+\"[^\"\n]*\")?\s*\)"
    r"|<((?:https?://|mailto:)[^\s<>|]+)(?:\|([^<>\n]*))?>"
)
"""A Markdown link or image `[label](url "title")`, or an autolink / Slack link `<url>`, `<url|label>`."""
_QUOTED = re.compile(r"((?:^|(?<=\n))[ \t]*(?:>[ \t]*)*)([^\n]*\n?)")


def escape(text: str) -> str:
    """Text shown exactly as written: no mention, link or control sequence in it works. Idempotent."""
    return _CONTROL.sub(lambda m: _ENTITY.get(m[0], m[0]), text)


def inert(text: str) -> str:
    """mrkdwn from someone we do not trust: its formatting (bold, lists, quotes, code) is kept, every mention and
    control sequence is shown as text, and a web or mail link stays a link that shows where it goes."""
    parts: list[str] = []
    at = 0
    for code in _CODE.finditer(text):
        # Inside code everything is shown as written, a link's target included.
        parts += [_prose(text[at : code.start()]), escape(code[0])]
        at = code.end()
    parts.append(_prose(text[at:]))
    return "".join(parts)


def from_markdown(markdown: str) -> str:
    """A model's Markdown as Slack mrkdwn, made inert: `[label](url)` shows its url beside the label."""
    converted: str = SlackMarkdownConverter().convert(markdown)
    return inert(converted.strip())


def inert_markdown(markdown: str) -> str:
    """A model's Markdown for Slack's markdown block: its formatting kept, nothing in it a mention, a control
    sequence or a link whose text hides where it goes. Code is left as written (Markdown shows it literally)."""
    parts: list[str] = []
    at = 0
    for code in _CODE.finditer(markdown):
        parts += [_markdown_prose(markdown[at : code.start()]), code[0]]
        at = code.end()
    parts.append(_markdown_prose(markdown[at:]))
    return "".join(parts)


def _markdown_prose(text: str) -> str:
    parts: list[str] = []
    at = 0
    for link in _MD_LINK.finditer(text):
        url, label = (link[2], link[1]) if link[2] is not None else (link[3], link[4] or "")
        parts += [_markdown_escape(text[at : link.start()]), _markdown_link(url, label)]
        at = link.end()
    parts.append(_markdown_escape(text[at:]))
    return "".join(parts)


def _markdown_escape(text: str) -> str:
    """`escape`, except a block quote's `>` at the start of a line, which is Markdown's own; and every square
    bracket left in prose escaped, so that no link Markdown might still see (nested or multi-line labels, other
    title quotes, reference definitions, `[label][ref]`) can hide its target."""
    escaped = "".join(quote + escape(rest) for quote, rest in _QUOTED.findall(text))
    return escaped.replace("[", "\\[").replace("]", "\\]")


def _markdown_link(url: str, label: str) -> str:
    """As `_link`: the target always shown, and a link only to the web or mail."""
    label = _markdown_escape(label.strip())
    shown = _markdown_escape(url).replace("[", "\\[").replace("]", "\\]")
    target = f"[{shown}]({url.replace(' ', '%20')})" if _SCHEME.match(url) else shown
    if not label or label in (shown, _SCHEME.sub("", shown)):
        return target
    return f"{label} ({target})"


def _prose(text: str) -> str:
    parts: list[str] = []
    at = 0
    for link in _LINK.finditer(text):
        parts += [escape(text[at : link.start()]), _link(link[1], link[2] or "")]
        at = link.end()
    parts.append(escape(text[at:]))
    return "".join(parts)


def _link(url: str, label: str) -> str:
    """A link whose visible text is its target: kept when its label is the url itself (what Slack makes of a url
    typed in a message), else shown as `label (url)`."""
    url, label = escape(url), escape(label).strip()
    if not label:
        return f"<{url}>"
    if label in (url, _SCHEME.sub("", url)):
        return f"<{url}|{label}>"
    return f"{label} (<{url}>)"
