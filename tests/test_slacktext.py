"""Untrusted text stays text: escaping, inert mrkdwn, the model's Markdown with its links shown, and clipping to
Slack's limits (the pure functions of `agents.markup`; the end-to-end cases are in test_escalation and test_slack)."""

from __future__ import annotations

import pytest

from agents.markup.limits import clip, fit, split_text
from agents.markup.text import escape, from_markdown, inert, inert_markdown

SPECIALS = "<!here> <!channel> <!everyone> <!subteam^S0123|@team> <@U0ADMIN> <#C0STAFF|staff>"


def test_escape_makes_every_control_sequence_text() -> None:
    assert escape(SPECIALS) == (
        "&lt;!here&gt; &lt;!channel&gt; &lt;!everyone&gt; &lt;!subteam^S0123|@team&gt; &lt;@U0ADMIN&gt; "
        "&lt;#C0STAFF|staff&gt;"
    )
    assert escape("if a < b && b > c") == "if a &lt; b &amp;&amp; b &gt; c"
    assert escape("<https://evil.example|driftwing.com>") == "&lt;https://evil.example|driftwing.com&gt;"


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("AT&amp;T", "AT&amp;T"),  # as Slack delivers a typed "AT&T": already escaped, kept
        ("&lt;b&gt; &amp;amp;", "&lt;b&gt; &amp;amp;"),  # a typed "<b> &amp;" stays that
        ("&copy; &#60; &", "&amp;copy; &amp;#60; &amp;"),  # only Slack's three entities count as escaped
        ("", ""),
    ],
)
def test_escape_keeps_slacks_own_entities_and_is_idempotent(text: str, escaped: str) -> None:
    assert escape(text) == escaped
    assert escape(escape(text)) == escape(text)


def test_inert_keeps_formatting_and_shows_where_links_go() -> None:
    text = "*Hi* _there_ <!here> see <https://evil.example/x?a=1&amp;b=2|driftwing.com> or <https://driftwing.com>"
    assert inert(text) == (
        "*Hi* _there_ &lt;!here&gt; see driftwing.com (<https://evil.example/x?a=1&amp;b=2>) or <https://driftwing.com>"
    )
    # What Slack makes of a url typed in a message: the label is the url, so the link is kept as it is.
    assert inert("<http://www.driftwing.com|www.driftwing.com>") == "<http://www.driftwing.com|www.driftwing.com>"
    assert inert("<mailto:help@driftwing.com|help@driftwing.com>") == "<mailto:help@driftwing.com|help@driftwing.com>"
    assert inert("<mailto:evil@evil.example|help@driftwing.com>") == ("help@driftwing.com (<mailto:evil@evil.example>)")
    # Only web and mail links are links; anything else in angle brackets is text.
    assert inert("<javascript:alert(1)|click> <slack://open|x>") == (
        "&lt;javascript:alert(1)|click&gt; &lt;slack://open|x&gt;"
    )
    # A quote (Slack delivers a typed "> " as "&gt; ") stays a quote.
    assert inert("&gt; quoted\n> also quoted") == "&gt; quoted\n&gt; also quoted"


def test_inert_shows_code_as_written() -> None:
    assert inert("run `a <b> && <!channel>` now <!here>") == (
        "run `a &lt;b&gt; &amp;&amp; &lt;!channel&gt;` now &lt;!here&gt;"
    )
    block = "```\n<https://evil.example|driftwing.com> <@U1>\n```"
    assert inert(block) == "```\n&lt;https://evil.example|driftwing.com&gt; &lt;@U1&gt;\n```"
    # An unclosed backtick is no code span: the rest is prose.
    assert inert("`<!channel>") == "`&lt;!channel&gt;"


def test_a_models_markdown_links_show_their_target() -> None:
    assert from_markdown("**Harrier X4** costs $1,299 - see [specs](https://example.com/hx4)") == (
        "*Harrier X4* costs $1,299 - see specs (<https://example.com/hx4>)"
    )
    reply = "<!channel> Visit [driftwing.com](https://evil.example) or <https://evil.example|driftwing.com>."
    assert from_markdown(reply) == (
        "&lt;!channel&gt; Visit driftwing.com (<https://evil.example>) or driftwing.com (<https://evil.example>)."
    )
    # Plain urls stay as written (Slack links them); a url as its own label stays a link.
    assert from_markdown("See https://driftwing.com/a_b and [https://x.example](https://x.example)") == (
        "See https://driftwing.com/a_b and <https://x.example|https://x.example>"
    )
    assert from_markdown("x < y & `<@U1>`") == "x &lt; y &amp; `&lt;@U1&gt;`"


def test_clip_never_cuts_an_entity_a_link_or_a_code_block_open() -> None:
    assert clip("short", 10) == "short"
    assert clip("a" * 20, 10) == "a" * 9 + "…"
    assert clip("one two three four five", 15) == "one two three…"
    assert clip("abcdef &amp; more", 9) == "abcdef…"
    assert clip("see <https://driftwing.com/a/long/path> now", 20) == "see…"
    clipped = clip("```\n" + "code " * 50 + "\n```", 40)
    assert len(clipped) <= 40 and clipped.count("```") == 2 and clipped.endswith("…\n```")


def test_fit_clips_each_field_to_slacks_limit() -> None:
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "N" * 200}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "r" * 2500}] * 12},
        {"type": "section", "text": {"type": "mrkdwn", "text": "s" * 3100}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "c" * 3100}]},
        {"type": "actions", "elements": [{"type": "button", "text": {"type": "plain_text", "text": "b" * 80}}]},
        {"type": "divider"},
    ]
    header, fields, section, context, actions, divider = fit(blocks)
    assert len(header["text"]["text"]) == 150 and header["text"]["text"].endswith("…")
    assert len(fields["fields"]) == 10 and all(len(f["text"]) == 2000 for f in fields["fields"])
    assert len(section["text"]["text"]) == 3000 and len(context["elements"][0]["text"]) == 3000
    assert len(actions["elements"][0]["text"]["text"]) == 75 and divider == {"type": "divider"}
    assert len(blocks[0]["text"]["text"]) == 200  # the blocks given are not changed
    assert len(fit([{"type": "divider"}] * 60)) == 50


def test_long_text_is_split_below_the_limit_keeping_code_fences() -> None:
    text = "intro\n\n```\n" + "\n".join(f"line {i}" for i in range(400)) + "\n```\nend"
    parts = split_text(text, limit=1000)
    assert len(parts) > 1 and all(len(p) <= 1010 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)
    assert "".join(parts).count("line 399") == 1


def test_markdown_for_the_markdown_block_keeps_its_layout_and_nothing_in_it_works_as_a_mention_or_disguise() -> None:
    text = (
        "## Title\n| a | b |\n|---|---|\n| <!here> | & |\n> quoted <@U1>\n"
        "[our site](https://evil.example) `<@U2>`\n[ref]: https://evil.example"
    )
    assert inert_markdown(text) == (
        "## Title\n| a | b |\n|---|---|\n| &lt;!here&gt; | &amp; |\n> quoted &lt;@U1&gt;\n"
        "our site ([https://evil.example](https://evil.example)) `<@U2>`\n\\[ref\\]: https://evil.example"
    )


@pytest.mark.parametrize(
    "sneaky",
    [
        "[a [b] c](https://evil.example)",
        "[Click\nhere](https://evil.example)",
        "[x]( https://evil.example 't')",
        "> [r]: https://evil.example\n[click][r]",
        "- [r]: https://evil.example\n\n[click][r]",
    ],
)
def test_no_markdown_link_hides_its_target_in_a_markdown_block(sneaky: str) -> None:
    """What a link regex misses stays text: every bracket left in prose is escaped, so Markdown sees no link."""
    shown = inert_markdown(sneaky)
    assert "[" not in shown.replace("\\[", "") and "]" not in shown.replace("\\]", "")
