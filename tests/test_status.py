"""What a customer sees of an answer in Slack, over HTTP with the emulator: the AI status while a turn works (and
the reactions where Slack has none), the answer in Slack's markdown block with feedback buttons under it (and only
under answers), and staff text shown as written."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.playground.slack_emulator import BOT_USER_ID, Msg, SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, slow, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
SUPPORT, STAFF = "C_SUPPORT", "C_STAFF"
TABLE_AND_LIST = (
    "## Batteries\n\n| Model | Flight time |\n|---|---|\n| Kestrel Mini 2 | 31 min |\n\n"
    "- charge to **80%** for storage\n- see [the guide](https://driftwing.example/batteries)"
)


def statuses(emulator: SlackEmulator) -> list[str]:
    return [str(c.params["status"]) for c in emulator.calls_to("assistant.threads.setStatus") if not c.failed]


def feedback_of(post: Msg) -> list[dict[str, Any]]:
    return [e for b in post.blocks or [] if b["type"] == "context_actions" for e in b["elements"]]


async def test_status_follows_the_turn_and_the_reply_clears_it(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        # Support looks the order named up before its first call (agents.loop prefetch), so it answers at once.
        slow(0.3, reply("It ships tomorrow.")),
    )
    said = await emulator.user_says(SUPPORT, "where is my order DW-1006?")
    assert (await replies_in(emulator, SUPPORT, said.ts, 2))[-1] == "It ships tomorrow."
    await settle(sessions)
    assert statuses(emulator) == ["is thinking…", "is asking Support…", "is checking your order…"]
    # Each shown while the turn worked: the last one before the answer was posted (the order of the calls, as Slack
    # got them, not a look at a moment the answer may already have passed on a loaded machine).
    last_status = emulator.calls_to("assistant.threads.setStatus")[-1].at
    posted = [c for c in emulator.calls_to("chat.postMessage") if c.params.get("blocks")]  # the answer, posted
    answered = [c.at for c in [*posted, *emulator.calls_to("chat.startStream")]]  # or streamed (a slow look-up)
    assert answered and last_status < min(answered)
    [first, *_] = emulator.calls_to("assistant.threads.setStatus")
    assert first.params["thread_ts"] == said.ts and first.params["loading_messages"]
    assert emulator.statuses == {}  # the reply cleared it, as Slack does
    message = emulator.message(SUPPORT, said.ts)
    assert message is not None and dict(message.reactions) == {"white_check_mark": (BOT_USER_ID,)}


async def test_a_turn_without_a_reply_clears_its_status(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    said = await emulator.user_says(SUPPORT, "a person please")
    await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await emulator.user_says(SUPPORT, "hello?", thread_ts=said.ts)  # waits for the colleague: no reply, no turn
    await settle(sessions)
    assert statuses(emulator)[:2] == ["is thinking…", "is finding a colleague…"]
    assert emulator.statuses == {}
    # Handed to a person, not answered: its 👀 is taken off and no ✅ put on (it would read as done).
    message = emulator.message(SUPPORT, said.ts)
    assert message is not None and dict(message.reactions) == {}


async def test_a_status_call_that_hangs_neither_blocks_nor_delays_the_reply(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.hold("assistant.threads.setStatus")  # Slack never answers it
    fake_llm.script(reply("Right away."))
    started = time.monotonic()
    said = await emulator.user_says(SUPPORT, "hello")
    assert await replies_in(emulator, SUPPORT, said.ts, 1) == ["Right away."]
    assert time.monotonic() - started < 1.5  # well under the status call's own 2 s timeout
    assert emulator.calls_to("assistant.threads.setStatus")  # it was asked, and not waited for
    await settle(sessions)
    message = emulator.message(SUPPORT, said.ts)
    assert message is not None and dict(message.reactions) == {"white_check_mark": (BOT_USER_ID,)}
    emulator.release("assistant.threads.setStatus")


async def test_where_slack_refuses_status_it_is_not_asked_again_and_reactions_show_progress(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.fail_next("assistant.threads.setStatus", status=200, error="missing_scope")
    for question in ("first question", "second question"):
        fake_llm.script(reply("An answer."))
        said = await emulator.user_says(SUPPORT, question)
        assert await replies_in(emulator, SUPPORT, said.ts, 1) == ["An answer."]
        await settle(sessions)
        message = emulator.message(SUPPORT, said.ts)
        assert message is not None and dict(message.reactions) == {"white_check_mark": (BOT_USER_ID,)}
    [refused] = emulator.calls_to("assistant.threads.setStatus")  # once for this kind of channel, then never
    assert refused.error == "missing_scope"
    assert slack_bot.metrics.status_failures.labels("missing_scope")._value.get() == 1


async def test_an_answer_renders_in_a_markdown_block_with_feedback_buttons_and_a_text_fallback(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply(TABLE_AND_LIST))
    said = await emulator.user_says(SUPPORT, "which batteries?")
    await replies_in(emulator, SUPPORT, said.ts, 2)
    notice, answer = emulator.posts(SUPPORT, said.ts)
    assert notice.text == "_Connecting you with Sales…_" and not notice.blocks  # a notice: no buttons
    assert answer.blocks is not None and answer.blocks[0]["type"] == "markdown"
    shown = answer.blocks[0]["text"]
    assert "| Kestrel Mini 2 | 31 min |" in shown and "## Batteries" in shown and "- charge to **80%**" in shown
    # The link shows its real target, in the block as in the text.
    assert "the guide ([https://driftwing.example/batteries](https://driftwing.example/batteries))" in shown
    assert "• charge to *80%* for storage" in answer.text and "<https://driftwing.example/batteries>" in answer.text
    [buttons] = feedback_of(answer)
    assert buttons["type"] == "feedback_buttons" and buttons["action_id"] == "answer_feedback"
    values = (buttons["positive_button"]["value"], buttons["negative_button"]["value"])
    assert values == ("good", "bad")  # the contract with the click handler (bot.answers)


async def test_feedback_buttons_can_be_turned_off(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    async with serving(bot_settings(database_url, fake_llm, emulator, feedback_buttons=False), emulator):
        fake_llm.script(reply("No buttons."))
        said = await emulator.user_says(SUPPORT, "hello")
        await replies_in(emulator, SUPPORT, said.ts, 1)
        [answer] = emulator.posts(SUPPORT, said.ts)
        assert answer.blocks is not None and [b["type"] for b in answer.blocks] == ["markdown"]


async def test_no_feedback_buttons_on_escalation_notices_and_relays_and_staff_bold_stays_bold(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    said = await emulator.user_says(SUPPORT, "a person please")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    await emulator.user_says(STAFF, "Sam here: *that* is _covered_.", user="U_STAFF", thread_ts=case.ts)
    [relay] = await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, said.ts) if p.username])
    assert relay.text == "Sam here: *that* is _covered_."  # Slack's bold and italics, as the colleague wrote them
    assert all(not feedback_of(post) for post in emulator.posts(SUPPORT, said.ts))


async def test_a_case_summary_shows_the_answers_bold_as_bold(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    async with serving(bot_settings(database_url, fake_llm, emulator, case_summary="transcript"), emulator):
        fake_llm.script(reply("The **Kestrel Mini 2** flies *31 minutes*."))
        said = await emulator.user_says(SUPPORT, "how long does it fly?")
        await replies_in(emulator, SUPPORT, said.ts, 1)
        fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
        await emulator.user_says(SUPPORT, "*really*? a person please", thread_ts=said.ts)
        [case] = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
        [summary] = [b["text"]["text"] for b in case.blocks or [] if "*Summary*" in str(b.get("text"))]
        assert "**" not in summary
        assert "The *Kestrel Mini 2* flies _31 minutes_." in summary  # the model's Markdown, as Slack shows it
        assert "*really*? a person please" in summary  # the customer's mrkdwn, as written
