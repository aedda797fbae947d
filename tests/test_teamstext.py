"""Untrusted text stays text in Teams: escaping, a model's Markdown, our Slack texts carried over, Adaptive Cards made
of our Block Kit, what Teams delivers read back, and long answers split (the pure functions of `bot.teams`)."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

from agents.knowledge.store import Hit
from agents.markup.text import escape as slack_escape
from agents.markup.text import inert
from bot.admin.views import help_reply, kb_hits_reply
from bot.teams.cards import CONTENT_TYPE, adaptive_card
from bot.teams.html import incoming_text
from bot.teams.limits import CARD_BYTES, clip, split_text, utf16_bytes
from bot.teams.text import escape, from_markdown, from_mrkdwn
from escalation.machine import CaseStatus
from escalation.views import ACTION_CLAIM, ACTION_HAND_BACK, ACTION_RESOLVE, CaseView, case_message

HOSTILE = (
    "<at>Sam Admin</at> <b>bold</b> <a href='https://evil.example'>driftwing.com</a> <img src=x onerror=alert(1)> "
    "[driftwing.com](https://evil.example) ![logo](https://evil.example/p.png) [ref][1] *star* _under_ ~tilde~ "
    "`tick` # hash | pipe \\ back &amp; &#60;at&#62; :warning: @here @channel"
)
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
_TEAMS_LINK = re.compile(r"(?<!\\)\[((?:\\.|[^\[\]\\])*)\]\(([^()\s]*)\)")


def shown(markdown: str) -> str:
    """What a CommonMark renderer shows of text without syntax: backslash escapes and entities undone, in one pass."""
    return re.sub(r"\\([!-/:-@\[-`{-~])|&(?:#\d+|\w+);", lambda m: m[1] or html.unescape(m[0]), markdown)


def prose(markdown: str) -> str:
    """Everything outside code, where Teams reads tags and links."""
    return _CODE.sub("", markdown)


def assert_inert(markdown: str) -> None:
    """No tag, no `<at>` and no link whose label hides its target, outside code."""
    outside = prose(markdown)
    assert "<" not in outside, markdown
    for label, target in _TEAMS_LINK.findall(outside):
        assert shown(label) in (target, re.sub(r"^(?:https?://|mailto:)", "", target)) or label in {
            "open the thread",
            "thread",
            "case",
        }, (label, target)


@pytest.mark.parametrize(
    "text",
    [
        HOSTILE,
        "<at>Helpdesk</at>",
        "- not a list\n+ nor this\n1. nor this\n2) nor this\n===\n# not a heading\n> not a quote",
        "a\\*b\\* \\\\ && <<>> ]]>",
        "",
    ],
)
def test_escape_shows_plain_text_exactly_as_written(text: str) -> None:
    escaped = escape(text)
    assert shown(escaped) == text  # round trip: the reader sees what was written
    assert "<" not in escaped and "[" not in escaped.replace("\\[", "")
    assert not re.search(r"(?m)^\s*(?:[-+=>#]|\d+[.)])", escaped.replace("\\", "\0"))


def test_escape_of_specials() -> None:
    assert escape("<at>Boss</at> [x](https://evil.example) *b* & 1. a") == (
        "&lt;at&gt;Boss&lt;/at&gt; \\[x\\](https://evil.example) \\*b\\* &amp; 1. a"
    )
    assert escape("1. first\n- second") == "1\\. first\n\\- second"


def test_a_models_markdown_keeps_its_formatting_and_shows_link_targets() -> None:
    answer = (
        "## Harrier X4\n**Price:** $1,299 _incl. VAT_ ~~$1,499~~\n- see [specs](https://example.com/hx4)\n"
        "- or <https://example.com/a_b>\n- [https://x.example](https://x.example)\n> quoted"
    )
    assert from_markdown(answer) == (
        "**Harrier X4**\n**Price:** $1,299 _incl. VAT_ ~~$1,499~~\n"
        "- see specs ([https://example.com/hx4](https://example.com/hx4))\n"
        "- or [https://example.com/a\\_b](https://example.com/a_b)\n"
        "- [https://x.example](https://x.example)\n> quoted"
    )
    assert from_markdown("run `a <b> && [x](y)`:\n```\n<html><at>x</at>\n```") == (
        "run `a <b> && [x](y)`:\n```\n<html><at>x</at>\n```"
    )


def test_a_models_html_mentions_and_disguised_links_stay_text() -> None:
    reply = (
        "<at>Sam Admin</at> Visit [driftwing.com](https://evil.example) or <b>here</b>.\n"
        "![driftwing.com](https://evil.example/x.png) [login][1] [js](javascript:alert(1))\n\n"
        "[1]: https://evil.example\n<!-- hidden --> &#60;at&#62;"
    )
    converted = from_markdown(reply)
    assert converted == (
        "&lt;at&gt;Sam Admin&lt;/at&gt; Visit driftwing.com ([https://evil.example](https://evil.example)) or "
        "&lt;b&gt;here&lt;/b&gt;.\n"
        "driftwing.com ([https://evil.example/x.png](https://evil.example/x.png)) \\[login\\]\\[1\\] "
        "js (javascript:alert(1))\n\n"
        "\\[1\\]: https://evil.example\n&lt;!-- hidden --&gt; &amp;#60;at&amp;#62;"
    )
    assert_inert(converted)


def test_our_slack_texts_carry_over_with_their_formatting() -> None:
    mrkdwn = (
        ":large_blue_circle: *Claimed by <@U0SAM>* in <#C0STAFF> · _nested *bold* here_ ~gone~ "
        "<https://driftwing.com/t?a=1&amp;b=2|open the thread> <mailto:help@driftwing.com> "
        "<!here> <!subteam^S1|@support> AT&amp;T 2*3*4 snake_case_name :party_parrot:\n"
        "&gt; a quote\n>also a quote\n`/support show <thread link>` ```\n&lt;code&gt;\n```"
    )
    assert from_mrkdwn(mrkdwn, names={"U0SAM": "Sam *Admin*"}) == (
        "🔵 **Claimed by @Sam \\*Admin\\*** in \\#C0STAFF · _nested **bold** here_ ~~gone~~ "
        "[open the thread](https://driftwing.com/t?a=1&b=2) [mailto:help@driftwing.com](mailto:help@driftwing.com) "
        "@here @support AT&amp;T 2\\*3\\*4 snake\\_case\\_name :party\\_parrot:\n"
        "> a quote\n> also a quote\n`/support show <thread link>` \n```\n<code>\n```"
    )


@pytest.mark.parametrize(
    "customer",
    [
        HOSTILE,
        "<https://evil.example|driftwing.com> <@U0ADMIN> <!channel> <#C0STAFF|staff>",
        "*[driftwing.com](https://evil.example)*",
        "_<at>Boss</at>_ ~<b>x</b>~",
        "`<at>in code</at>` then [x](https://evil.example) ```\n[y](https://evil.example)\n```",
        "\ue0000\ue001 forged marker \ue000",
    ],
)
def test_what_slack_made_inert_stays_inert_in_teams(customer: str) -> None:
    for slack in (inert(customer), slack_escape(customer), f"*{slack_escape(customer)}* (customer): {inert(customer)}"):
        teams = from_mrkdwn(slack)
        assert_inert(teams)
        assert "\ue000" not in teams and "\ue001" not in teams


def case_view(**changes: Any) -> CaseView:
    fields: dict[str, Any] = {
        "escalation_id": 42,
        "customer": "Casey <at>Boss</at> [driftwing.com](https://evil.example)",
        "channel": "C0SUPPORT",
        "permalink": "https://driftwing.slack.com/archives/C0SUPPORT/p1700000000000100",
        "reason": "wants a *refund* <!here> <https://evil.example|driftwing.com>",
        "summary": inert("Customer: <@U0CASEY> asked for DW-1006 & `<b>`"),
        "agent": "support",
        "status": CaseStatus.OPEN,
    }
    return CaseView(**(fields | changes))


def texts(element: Any) -> list[str]:
    """Every TextBlock's text in a card body, in order."""
    if isinstance(element, list):
        return [t for e in element for t in texts(e)]
    if element.get("type") == "TextBlock":
        return [element["text"]]
    return texts(element.get("items", [])) + texts([i for c in element.get("columns", []) for i in c["items"]])


def test_a_case_message_becomes_an_adaptive_card() -> None:
    message = case_message(case_view())
    assert message.blocks is not None
    card = adaptive_card(message.blocks, fallback=message.text, names={"C0SUPPORT": "support"})
    assert card["contentType"] == CONTENT_TYPE
    content = card["content"]
    assert content["type"] == "AdaptiveCard" and content["version"] == "1.5"
    assert content["msteams"] == {"width": "Full"}
    header, fields, summary, status, note = content["body"]
    assert header == {
        "type": "TextBlock",
        "text": "Case \\#42: Casey &lt;at&gt;Boss&lt;/at&gt; \\[driftwing.com\\](https://evil.example)",
        "wrap": True,
        "size": "Large",
        "weight": "Bolder",
    }
    assert fields["type"] == "Container" and [i["type"] for i in fields["items"]] == ["ColumnSet", "ColumnSet"]
    assert texts(fields) == [
        "**Customer**\n\nCasey &lt;at&gt;Boss&lt;/at&gt; \\[driftwing.com\\](https://evil.example)",
        "**Where**\n\n\\#support · [open the thread](https://driftwing.slack.com/archives/C0SUPPORT/p1700000000000100)",
        "**Reason**\n\nwants a **refund** &lt;!here&gt; driftwing.com ([https://evil.example](https://evil.example))",
        "**Escalated by**\n\nsupport agent",
    ]
    assert summary["text"] == "**Summary**\n\nCustomer: &lt;@U0CASEY&gt; asked for DW-1006 &amp; `&lt;b&gt;`"
    assert status["text"] == "🟠 **Waiting for a colleague**" and status["isSubtle"] is True
    assert note["text"].endswith("Start a message with `note:` to keep it internal.")
    assert content["actions"] == [
        {"type": "Action.Submit", "title": "Claim", "data": {"helpdesk_action": ACTION_CLAIM, "value": "42"}},
        {
            "type": "Action.Submit",
            "title": "Resolve",
            "data": {"helpdesk_action": ACTION_RESOLVE, "value": "42"},
            "style": "positive",
        },
        {
            "type": "Action.Submit",
            "title": "Hand back to bot",
            "data": {"helpdesk_action": ACTION_HAND_BACK, "value": "42"},
        },
    ]
    assert content["fallbackText"].startswith("Case \\#42: Casey &lt;at&gt;Boss&lt;/at&gt;")
    for text in [*texts(content["body"]), content["fallbackText"]]:
        assert_inert(text)
        assert "<" not in text  # in code neither: a card shows code as text
    json.dumps(card)  # a plain dict, ready to send


def test_a_claimed_case_names_its_colleague_and_has_no_claim_button() -> None:
    """A Teams colleague is named (their name is other people's text, escaped), not shown as a raw id."""
    view = case_view(status=CaseStatus.CLAIMED, claimed_by="29:1sam", names={"29:1sam": "Sam <at>Lee</at>"})
    message = case_message(view)
    assert message.blocks is not None
    content = adaptive_card(message.blocks, fallback=message.text)["content"]
    assert "🔵 **Claimed by Sam &lt;at&gt;Lee&lt;/at&gt;**" in texts(content["body"])
    assert [a["title"] for a in content["actions"]] == ["Resolve", "Hand back to bot"]


def test_an_admin_answer_becomes_a_card_with_its_code_and_quotes() -> None:
    reply = help_reply("show")
    card = adaptive_card(reply.blocks, fallback=reply.text)["content"]
    assert texts(card["body"]) == [
        "/support",
        "`/support show &lt;thread link&gt;`  one conversation: state, agent, last messages, handoffs",
        "Thread links: a message's ⋯ → **Copy link**. Case numbers work too.",
    ]
    assert card["actions"] == []
    hit = Hit(
        source="guide.md",
        title="Guide",
        heading=None,
        text="Returns: <at>Boss</at> see [driftwing.com](https://evil.example) <!channel>",
        score=0.5,
        similarity=0.5,
        collection="docs",
    )
    reply = kb_hits_reply("refund *policy*", [hit])
    card = adaptive_card(reply.blocks, fallback=reply.text)["content"]
    title, intro, passage = texts(card["body"])
    assert title == "Knowledge base" and intro == "Top 1 for _refund **policy**_:"
    assert (
        passage.startswith("**1.** Guide (guide.md) · `docs` · score 0.500")
        and "\n\n&gt; Returns: &lt;at&gt;Boss&lt;/at&gt; see \\[driftwing" in passage
    )
    assert passage.endswith("&lt;!channel&gt;")
    for text in texts(card["body"]):
        assert_inert(text)


def test_a_card_with_too_much_text_is_clipped_under_teams_limit() -> None:
    long_summary = inert("word <@U1> [x](https://evil.example) " * 3000)
    message = case_message(case_view(summary=long_summary))
    assert message.blocks is not None
    # Slack's own clipping keeps each block under 3,000 characters; many of them still outgrow one Teams message.
    blocks = message.blocks + [{"type": "section", "text": {"type": "mrkdwn", "text": "🚁" * 2900}}] * 20
    card = adaptive_card(blocks, fallback=message.text)
    assert utf16_bytes(json.dumps(card["content"], ensure_ascii=False)) <= CARD_BYTES
    body = card["content"]["body"]
    assert body[0]["text"].startswith("Case \\#42") and len(card["content"]["actions"]) == 3
    assert any(t.endswith("…") for t in texts(body))
    for text in texts(body):
        assert_inert(text)
    assert len(blocks[-1]["text"]["text"]) == 2900  # the blocks given are not changed


def test_dividers_and_unknown_blocks() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "divider"},
        {"type": "section", "text": {"type": "plain_text", "text": "a &amp; b <x>"}},
        {"type": "divider"},
        {"type": "image", "image_url": "https://example.com/i.png", "alt_text": "i"},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "one"}, {"type": "plain_text", "text": "two"}]},
        {
            "type": "actions",
            "elements": [
                {"type": "button", "action_id": "x", "text": {"type": "plain_text", "text": "Go"}, "style": "danger"}
            ],
        },
    ]
    content = adaptive_card(blocks, fallback="fallback")["content"]
    first, context = content["body"]
    assert first == {"type": "TextBlock", "text": "a &amp; b &lt;x&gt;", "wrap": True}
    assert context["separator"] is True and context["text"] == "one  two"
    assert content["actions"] == [
        {"type": "Action.Submit", "title": "Go", "data": {"helpdesk_action": "x", "value": ""}, "style": "destructive"}
    ]


def test_a_channel_message_is_read_as_its_writer_wrote_it() -> None:
    delivered = (
        "<div><div><p><at>Helpdesk</at>&nbsp;where is   my order &lt;DW-1006&gt; &amp; "
        "<strong>refund</strong>?</p>\n<p>Ask <at>Sam Lee</at> too.<br>Thanks&nbsp;&nbsp;!</p>"
        '<p><a href="https://evil.example/x">driftwing.com</a> '
        '<a href="https://driftwing.com">https://driftwing.com</a> '
        '<img alt="😀" itemtype="http://schema.skype.com/Emoji" src="https://x/e.png"></p>'
        "<ul><li>one</li><li>two</li></ul></div></div>"
    )
    assert incoming_text(delivered, bot_names=["helpdesk"]) == (
        "where is my order <DW-1006> & refund?\n"
        "Ask @Sam Lee too.\nThanks !\n"
        "driftwing.com (https://evil.example/x) https://driftwing.com 😀\n- one\n- two"
    )


@pytest.mark.parametrize(
    ("delivered", "written"),
    [
        ("<at>Helpdesk Bot</at> hi there", "hi there"),
        ("Hi <at>Helpdesk Bot</at>, my drone\n  fell:\n\nsee photo", "Hi , my drone\n  fell:\n\nsee photo"),
        ("a < b && c > d", "a < b && c > d"),
        ("<p><at>Helpdesk Bot</at></p>", ""),
        ("<p>&lt;at&gt;Boss&lt;/at&gt; <script>x</script></p>", "<at>Boss</at> x"),
        ("<p>\x00<at>Helpdesk\x00 Bot</at>x</p>", "x"),
    ],
)
def test_what_teams_delivers_in_other_shapes(delivered: str, written: str) -> None:
    assert incoming_text(delivered, bot_names=["Helpdesk  bot"]) == written


def test_a_long_answer_is_split_never_inside_a_link_or_code() -> None:
    link = "[the Harrier X4 manual, chapter 3](https://driftwing.com/manuals/harrier-x4/chapter-3)"
    fence = "```\n" + "\n".join(f"step {i}: press <b>" for i in range(60)) + "\n```"
    text = "\n\n".join([("Intro with " + link + " ") * 12, fence, "Then `inline <code> here` " * 40, "end"])
    parts = split_text(text, limit=1000)
    assert len(parts) > 3
    for part in parts:
        assert len(part) <= 1000 + 4  # a fence cut open is closed
        assert part.count("```") % 2 == 0
        assert part.count("[the Harrier") == part.count("chapter-3)")
        assert prose(part).count("`") == 0
    joined = "\n".join(parts)
    assert joined.count(link) == 12 and all(f"step {i}:" in joined for i in range(60)) and parts[-1].endswith("end")
    assert split_text("short") == ["short"] and split_text("  ") == []


def test_a_fence_longer_than_a_post_is_closed_and_reopened() -> None:
    text = "```\n" + "\n".join(f"line {i}" for i in range(400)) + "\n```"
    parts = split_text(text, limit=500)
    assert len(parts) > 5 and all(p.startswith("```") and p.endswith("```") for p in parts)
    assert "\n".join(parts).count("line 399") == 1


def test_clip_never_cuts_a_link_an_escape_or_an_entity() -> None:
    assert clip("short", 10) == "short"
    assert clip("see [driftwing](https://driftwing.com/a/long/path) now", 30) == "see…"
    assert clip("abcdef &amp; more", 10) == "abcdef…"
    assert clip("abcdefgh\\* more", 10) == "abcdefgh…"
    clipped = clip("```\n" + "code " * 50 + "\n```", 40)
    assert len(clipped) <= 40 and clipped.count("```") == 2 and clipped.endswith("…\n```")
