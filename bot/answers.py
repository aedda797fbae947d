"""An AI agent's answer as Slack shows it: the model's Markdown in Slack's `markdown` block (docs.slack.dev, Block Kit
reference: markdown block; Slack renders headings, lists, tables and links itself, 12,000 characters a message), the
same words as mrkdwn in `text` for notifications and for clients that show no blocks, and under it 👍/👎 feedback
buttons (a `context_actions` block holding one `feedback_buttons` element).

The buttons' contract with whoever handles their clicks: `action_id` is `FEEDBACK_ACTION`, the value a `Feedback`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from agents.db.deliveries import Source
from agents.language import Language
from agents.markup.limits import MESSAGE_TEXT, TEXT_OBJECT, clip, fit
from agents.markup.text import escape, from_markdown, inert_markdown
from agents.texts import Text, Texts
from escalation.views import Message

FEEDBACK_ACTION = "answer_feedback"


class Feedback(StrEnum):
    """A feedback button's value."""

    GOOD = "good"
    BAD = "bad"


def feedback_buttons(texts: Texts, language: Language | None) -> dict[str, Any]:
    """The 👍/👎 buttons, labelled for screen readers in the customer's language."""

    def button(feedback: Feedback, face: str, label: Text) -> dict[str, Any]:
        text = {"type": "plain_text", "text": face}
        return {"text": text, "value": feedback.value, "accessibility_label": texts.get(label, language)}

    return {
        "type": "context_actions",
        "elements": [
            {
                "type": "feedback_buttons",
                "action_id": FEEDBACK_ACTION,
                "positive_button": button(Feedback.GOOD, "👍", Text.FEEDBACK_HELPED),
                "negative_button": button(Feedback.BAD, "👎", Text.FEEDBACK_NOT_HELPED),
            }
        ],
    }


def answer_message(
    markdown: str,
    *,
    feedback: bool,
    sources: tuple[Source, ...] = (),
    texts: Texts | None = None,
    language: Language | None = None,
) -> Message:
    """One post of an answer; `markdown` is the model's, made inert here for both the block and the text. Its sources
    are a line under it ("Sources: Warranty › Proof of purchase, ..."), each a link where it has one; that line and
    the buttons' labels are in the conversation's `language`."""
    texts = texts or Texts()
    blocks: list[dict[str, Any]] = [{"type": "markdown", "text": inert_markdown(markdown)}]
    if sources and (template := texts.get(Text.SOURCES_LINE, language)):  # an empty override: no line
        line = template.format(sources=", ".join(_cited(source) for source in sources))
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": clip(line, TEXT_OBJECT)}]})
    if feedback:
        blocks.append(feedback_buttons(texts, language))
    text = clip(from_markdown(markdown), MESSAGE_TEXT)
    return Message(text, blocks=fit(blocks), native=True, ai=True, sources=sources)


def _cited(source: Source) -> str:
    # A label or link holding `|` or `>` would end Slack's link early: such a label is shown as text.
    label = escape(source.label.replace("|", "/"))
    url = source.url
    return f"<{url}|{label}>" if url is not None and not any(c in url for c in "|<> ") else label
