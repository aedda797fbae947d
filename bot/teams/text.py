"""Whatever a customer, a colleague or a model writes stays text in Teams.

We send message text with `textFormat: "markdown"`. Teams renders a subset of Markdown there (bold, italic,
strikethrough, lists, preformatted text, blockquotes, hyperlinks; no headers, no tables) and also interprets some
XML/HTML tags ("Format your bot messages", learn.microsoft.com/microsoftteams/platform/bots/how-to/
format-your-bot-messages). An Adaptive Card's `TextBlock` renders a smaller subset (bold, italic, lists,
hyperlinks; no HTML: "Text formatting in cards", .../task-modules-and-cards/cards/cards-format). A mention exists
only as `<at>Name</at>` together with a `mention` entity in the activity (or in the card's `msteams.entities`);
we never send such an entity, so no text of ours can notify anyone. What text can still do is look like a mention
(`<at>`), carry HTML, or hide a link's target behind a label (`[driftwing.com](https://evil.example)`). So:

- `escape` makes plain text literal: Markdown punctuation is backslash-escaped (CommonMark lets any ASCII
  punctuation be escaped), `&`, `<` and `>` become entities, so no tag, `<at>` or link can start.
- `from_markdown` keeps a model's formatting, shows each link's real target, and makes its HTML text.
- `from_mrkdwn` carries our Slack texts over (they are Slack mrkdwn, their untrusted parts made inert for Slack by
  `agents.markup.text`): Slack's own formatting and links become Teams Markdown, and everything Teams would read as
  syntax but Slack did not (a typed `[x](y)`, `#`, `|`, a backslash) is escaped.

Code is shown as written: CommonMark renders a code span or fence literally (no tags, no links, no entities), so its
`<` stays a `<` (a command's `<folder>`) and Slack's entities in it are decoded. Outside code, no `<` ever leaves
this module. (Card renderers differ on entities, microsoft/AdaptiveCards#1985: where one shows `&lt;` as written
instead of `<`, the text is uglier but still text.)

Both conversions hold finished pieces (code, links, mentions) aside while the rest is escaped, marked with two
private-use characters; those characters are removed from the input first, so nobody can write a marker.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from bot.teams.emoji import emojize

_HOLD, _END = "\ue000", "\ue001"
_HELD = re.compile(f"{_HOLD}(\\d+){_END}")
_PUNCT = re.compile(r"[\\`*_~\[\]#|&<>]")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_LIST = re.compile(r"^([ \t]*)(?:([-+=])|(\d+)([.)]))", re.MULTILINE)
_SCHEME = re.compile(r"^(?:https?://|mailto:)", re.IGNORECASE)
_SLACK_ENTITY = re.compile(r"&(amp|lt|gt);")
_SLACK_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
_SLACK_CONTROL = re.compile(r"<([^<>]*)>")
_SLACK_QUOTE = re.compile(r"^(?:&gt;|>) ?", re.MULTILINE)
_SLACK_STYLE = re.compile(r"(?<![\w*_~])([*_~])(?!\s)([^\n]*?[^\s\\])\1(?![\w*_~])")
_TEAMS_STYLE = {"*": "**", "_": "_", "~": "~~"}
_MD_CODE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$|`[^`\n]+`", re.DOTALL | re.MULTILINE)
_MD_LINK = re.compile(
    r"!?\[([^\[\]\n]*)\]\(\s*([^\s()<>]+(?:\([^\s()<>]*\)[^\s()<>]*)*)(?:\s+\"[^\"\n]*\")?\s*\)"
    r"|<((?:https?://|mailto:)[^\s<>]+)>",
    re.IGNORECASE,
)
_MD_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
_MD_QUOTE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+", re.MULTILINE)
_MD_UNSAFE = re.compile(r"[&<>\[\]]")
_MD_STYLE_MARK = re.compile(r"[*_`~]")


def escape(text: str) -> str:
    """Plain text shown exactly as written in a Teams message or a TextBlock: no formatting, tag, mention or link
    starts in it."""
    return _unlisted(_literal(text))


def _literal(text: str) -> str:
    return _PUNCT.sub(lambda m: _HTML.get(m[0]) or "\\" + m[0], text)


def _unlisted(text: str) -> str:
    """A line starting "- ", "+ ", "1. " or "===" would become a list or a heading."""
    return _LIST.sub(lambda m: m[1] + (f"\\{m[2]}" if m[2] else f"{m[3]}\\{m[4]}"), text)


def from_markdown(markdown: str) -> str:
    """A model's Markdown as Teams message Markdown: its formatting kept (headings, which Teams does not render in
    a message, as bold lines), each link showing its target, HTML and `<at>` shown as text."""
    held: list[str] = []
    hold = _holder(held)
    text = _MD_CODE.sub(lambda m: hold(m[0]), _unmarked(markdown.strip()))
    text = _MD_LINK.sub(lambda m: hold(_md_link(m[3] or m[2], m[1] or "")), text)
    text = _MD_HEADING.sub(lambda m: f"**{m[1]}**", text)
    text = _MD_QUOTE.sub(lambda m: hold("> " * m[0].count(">")), text)
    # What is left is prose: a tag, an entity or a bracket (a reference link, an image) must not work.
    text = _MD_UNSAFE.sub(lambda m: _HTML.get(m[0]) or "\\" + m[0], text)
    return _unhold(text, held)


def from_mrkdwn(text: str, *, names: Mapping[str, str] | None = None) -> str:
    """Slack mrkdwn (as our views write it: Slack's entities, `*bold*`, `<url|label>`, `<@U…>`, `:emoji:`) as Teams
    Markdown showing the same. `names` gives the display name of a user or channel id; an id without one is shown
    as it is (`@U123`, `#C123`)."""
    held: list[str] = []
    hold = _holder(held)
    text = _SLACK_CODE.sub(lambda m: hold(_slack_code(m[0], m.start(), m.string)), _unmarked(text))
    text = _SLACK_CONTROL.sub(lambda m: hold(_slack_control(m[1], names or {})), text)
    text = _SLACK_QUOTE.sub(lambda m: hold("> "), text)
    return _unhold(_unlisted(_styled(unslack(emojize(text)))), held)


def link(url: str, label: str) -> str:
    """A Teams Markdown link to a web or mail address, `label` shown as text."""
    target = url.replace("(", "%28").replace(")", "%29").replace(" ", "%20").replace("<", "%3C").replace(">", "%3E")
    return f"[{escape(label)}]({target})"


def _md_link(url: str, label: str) -> str:
    """A model's link, shown so that its target is visible: as it is when its label is its url, else as
    `label (url)`; anything but a web or mail address is text."""
    shown = _MD_STYLE_MARK.sub("", label).strip()
    if not _SCHEME.match(url):
        return escape(f"{shown} ({url})" if shown else url)
    if shown in ("", url, _SCHEME.sub("", url)):
        return link(url, shown or url)
    return f"{escape(shown)} ({link(url, url)})"


def _slack_code(code: str, at: int, whole: str) -> str:
    """Slack's code as Teams code: a fence on lines of its own, the content as written."""
    content = unslack(code.strip("`"))
    if not code.startswith("```"):
        return f"`{content}`"
    before = "" if at == 0 or whole[at - 1] == "\n" else "\n"
    after = "" if whole[at + len(code) : at + len(code) + 1] in ("", "\n") else "\n"
    return f"{before}```\n{content.strip(chr(10))}\n```{after}"


def _slack_control(inner: str, names: Mapping[str, str]) -> str:
    """One of Slack's `<…>` sequences: a mention or a channel as plain text, a web or mail link as a link, anything
    else shown as written."""
    target, _, label = inner.partition("|")
    label = unslack(label)
    match target[:1]:
        case "@":
            return escape("@" + (names.get(target[1:]) or label or target[1:]))
        case "#":
            return escape("#" + (names.get(target[1:]) or label or target[1:]))
        case "!":  # <!here>, <!subteam^S1|@team>, <!date^…|fallback>: their text, which notifies nobody in Teams
            return escape(label or "@" + target[1:].split("^")[0])
    if _SCHEME.match(target):
        url = unslack(target)
        return link(url, label or url)
    return escape(unslack(f"<{inner}>"))


def _styled(text: str) -> str:
    """Slack's `*bold*`, `_italic_` and `~strike~` (nested or not) as Teams Markdown; everything else escaped."""
    parts: list[str] = []
    at = 0
    for style in _SLACK_STYLE.finditer(text):
        mark = _TEAMS_STYLE[style[1]]
        parts += [_literal(text[at : style.start()]), mark, _styled(style[2]), mark]
        at = style.end()
    parts.append(_literal(text[at:]))
    return "".join(parts)


def unslack(text: str) -> str:
    """Slack's text with its three entities decoded: the characters its writer typed."""
    return _SLACK_ENTITY.sub(lambda m: {"amp": "&", "lt": "<", "gt": ">"}[m[1]], text)


def _unmarked(text: str) -> str:
    return text.replace(_HOLD, "\ufffd").replace(_END, "\ufffd")


def _holder(held: list[str]) -> Callable[[str], str]:
    def hold(piece: str) -> str:
        held.append(piece)
        return f"{_HOLD}{len(held) - 1}{_END}"

    return hold


def _unhold(text: str, held: list[str]) -> str:
    return _HELD.sub(lambda m: held[int(m[1])], text)
