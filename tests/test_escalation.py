"""Human takeover over HTTP: the case in the staff channel, relays both ways, claim, resolve, hand back,
notes, edits, deletions, reminders, and what is refused. The emulator plays Slack; the fake LLM the agents."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.leases import Leases
from bot.playground.slack_emulator import BOT_ID, Msg, SlackEmulator
from escalation.policy import BusinessHours
from escalation.views import ACTION_CLAIM, ACTION_HAND_BACK, ACTION_RESOLVE
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.scenarios import STAFF, SUPPORT, escalate, escalation_row, relays_to_customer

Sessions = async_sessionmaker[AsyncSession]


def case_thread(emulator: SlackEmulator, case: Msg) -> list[str]:
    return [p.text for p in emulator.posts(STAFF, case.ts) if p.thread_ts == case.ts]


def staff_edit(ts: str, case_ts: str, text: str, *, was: str) -> dict[str, Any]:
    """The `message_changed` event of a colleague editing their message in a case's thread."""
    return {
        "type": "message",
        "subtype": "message_changed",
        "channel": STAFF,
        "hidden": True,
        "message": {"type": "message", "user": "U_STAFF", "text": text, "ts": ts, "thread_ts": case_ts},
        "previous_message": {"user": "U_STAFF", "text": was, "ts": ts},
    }


def actions_of(emulator: SlackEmulator, case: Msg) -> list[str]:
    message = emulator.message(STAFF, case.ts)
    assert message is not None and message.blocks is not None
    return [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]


async def test_escalation_relay_claim_and_hand_back(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    assert [p.text for p in emulator.posts(SUPPORT, thread)] == [
        "I've asked a colleague to join. A person will reply here shortly."
    ]
    blocks = json.dumps(case.blocks)
    assert "Casey Customer" in blocks and "customer asked for a person" in blocks and "triage agent" in blocks
    assert f"https://driftwing.slack.com/archives/{SUPPORT}/p{thread.replace('.', '')}" in blocks
    assert "can I talk to an actual human being?" in blocks  # the summary: the conversation's last messages
    assert actions_of(emulator, case) == [ACTION_CLAIM, ACTION_RESOLVE, ACTION_HAND_BACK]
    row = await escalation_row(sessions)
    assert (row.status, row.case_channel, row.case_ts, row.customer) == ("open", STAFF, case.ts, "U_CUSTOMER")

    # The customer writes again: relayed to the case thread, and the bot stays quiet.
    await emulator.user_says(SUPPORT, "hello? anyone?", thread_ts=thread)
    assert await emulator.wait_for(lambda: case_thread(emulator, case)) == [
        "*Casey Customer* (customer): hello? anyone?"
    ]
    assert fake_llm.calls == 1

    # Claim: recorded, and the case message shows it.
    assert (await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts)).status == 200
    await settle(sessions)
    row = await escalation_row(sessions)
    assert (row.status, row.claimed_by) == ("claimed", "U_STAFF") and row.claimed_at is not None
    assert actions_of(emulator, case) == [ACTION_RESOLVE, ACTION_HAND_BACK]
    assert "Claimed by <@U_STAFF>" in json.dumps(emulator.message(STAFF, case.ts).blocks)  # type: ignore[union-attr]

    # Staff reply in the case thread: relayed under the colleague's name and avatar. A note is not.
    await emulator.user_says(STAFF, "Hi Casey, Sam here. Which drone is it?", user="U_STAFF", thread_ts=case.ts)
    note = await emulator.user_says(STAFF, "note: probably a warranty case", user="U_STAFF", thread_ts=case.ts)
    relayed = await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, thread) if p.username])
    await settle(sessions)
    assert [(p.text, p.username) for p in relayed] == [
        ("Hi Casey, Sam here. Which drone is it?", "Sam Staff (Driftwing team)")
    ]
    assert relayed[0].icon_url is not None
    assert dict(emulator.message(STAFF, note.ts).reactions) == {"memo": ("UBOT",)}  # type: ignore[union-attr]

    # Hand back: the customer is told, the bot answers again and knows what the colleague said.
    await emulator.click(ACTION_HAND_BACK, str(row.id), message_ts=case.ts)
    await settle(sessions)
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("You're back with our assistant")
    assert actions_of(emulator, case) == []
    fake_llm.script(reply("The Kestrel Mini 2 is covered; let's book the repair."))
    await emulator.user_says(SUPPORT, "It's a Kestrel Mini 2", thread_ts=thread)
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, thread)[-1].text.startswith("The Kestrel"))
    contents = [str(msg.get("content")) for msg in fake_llm.requests[-1].messages]
    assert "[U_STAFF (human colleague)]: Hi Casey, Sam here. Which drone is it?" in contents
    assert "hello? anyone?" in contents and not any("warranty case" in c for c in contents)
    row = await escalation_row(sessions)
    assert (row.status, row.closed_by) == ("handed_back", "U_STAFF") and row.first_response_at is not None


async def test_resolve_closes_and_a_later_message_reopens_with_the_bot(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    # A first staff reply claims the case implicitly.
    await emulator.user_says(STAFF, "On it!", user="U_STAFF", thread_ts=case.ts)
    await emulator.wait_for(lambda: relays_to_customer(emulator, thread))
    await settle(sessions)
    row = await escalation_row(sessions)
    assert (row.status, row.claimed_by) == ("claimed", "U_STAFF") and row.first_response_at is not None
    await emulator.click(ACTION_RESOLVE, str(row.id), message_ts=case.ts)
    await settle(sessions)
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("This conversation is now closed")
    assert "Resolved by <@U_STAFF>" in json.dumps(emulator.message(STAFF, case.ts).blocks)  # type: ignore[union-attr]
    row = await escalation_row(sessions)
    assert row.status == "resolved" and row.closed_at is not None

    fake_llm.script(reply("Welcome back! How can I help?"))
    await emulator.user_says(SUPPORT, "one more question", thread_ts=thread)
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, thread)[-1].text == "Welcome back! How can I help?")
    assert "front desk" in fake_llm.requests[-1].system


async def test_relays_keep_order_both_ways_and_duplicates_relay_once(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    for i in range(4):
        await emulator.user_says(SUPPORT, f"customer {i}", thread_ts=thread)
    staff = [await emulator.user_says(STAFF, f"staff {i}", user="U_STAFF", thread_ts=case.ts) for i in range(4)]
    # Slack retries the first staff message, and delivers it once more under a new event id.
    retried = {
        "type": "message",
        "channel": STAFF,
        "user": "U_STAFF",
        "text": "staff 0",
        "ts": staff[0].ts,
        "thread_ts": case.ts,
    }
    assert (await emulator.deliver_event(retried, retry_num=1)).status == 200
    await emulator.wait_for(lambda: len(relays_to_customer(emulator, thread)) >= 4)
    await emulator.wait_for(lambda: len(case_thread(emulator, case)) >= 4)
    await settle(sessions)
    assert relays_to_customer(emulator, thread) == [f"staff {i}" for i in range(4)]
    assert case_thread(emulator, case) == [f"*Casey Customer* (customer): customer {i}" for i in range(4)]


async def test_editing_and_deleting_a_staff_message_reaches_the_copy(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    said = await emulator.user_says(STAFF, "Your refund is $30", user="U_STAFF", thread_ts=case.ts)
    [copy] = await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, thread) if p.username])
    await emulator.deliver_event(staff_edit(said.ts, case.ts, "Your refund is $300", was="Your refund is $30"))
    await emulator.wait_for(lambda: emulator.message(SUPPORT, copy.ts).text == "Your refund is $300")  # type: ignore[union-attr]
    deleted = {
        "type": "message",
        "subtype": "message_deleted",
        "channel": STAFF,
        "hidden": True,
        "deleted_ts": said.ts,
        "previous_message": {"user": "U_STAFF", "ts": said.ts, "thread_ts": case.ts},
    }
    await emulator.deliver_event(deleted)
    await emulator.wait_for(lambda: emulator.message(SUPPORT, copy.ts).deleted)  # type: ignore[union-attr]
    await settle(sessions)
    assert relays_to_customer(emulator, thread) == []


async def test_reminders_follow_the_clock(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    _, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    desk = slack_bot.desk
    assert await desk.remind(now=row.created_at + timedelta(minutes=14)) == 0
    assert await desk.remind(now=row.created_at + timedelta(minutes=16)) == 1
    assert await desk.remind(now=row.created_at + timedelta(minutes=20)) == 0  # the next one is due at 30
    assert await desk.remind(now=row.created_at + timedelta(minutes=31)) == 1
    assert await desk.remind(now=row.created_at + timedelta(hours=5)) == 0  # at most two
    reminders = await emulator.wait_for(
        lambda: (r := [p for p in emulator.posts(STAFF, case.ts) if "waited" in p.text]) and len(r) == 2 and r
    )
    assert "Case #" in reminders[0].text and "16 min" in reminders[0].text
    # Answered cases get no reminder.
    await emulator.user_says(STAFF, "Here now", user="U_STAFF", thread_ts=case.ts)
    await settle(sessions)


async def test_messages_outside_case_threads_and_bots_are_ignored(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    top = await emulator.user_says(STAFF, "lunch anyone?", user="U_STAFF")
    await emulator.user_says(STAFF, "sure", user="U_STAFF", thread_ts=top.ts)  # a thread, but not a case's
    bot_like = {
        "type": "message",
        "channel": STAFF,
        "bot_id": "B_OTHER",
        "user": "U_OTHERBOT",
        "text": "beep",
        "ts": "1999999999.000001",
        "thread_ts": case.ts,
    }
    await emulator.deliver_event(bot_like)
    await settle(sessions)
    assert relays_to_customer(emulator, thread) == []
    async with sessions() as s:
        dispositions = set((await s.scalars(select(m.Received.disposition))).all())
    assert "ignored: not a case thread" in dispositions and "ignored: bot message in the staff channel" in dispositions
    # Our own relays into the case thread are echoed back by Slack and never relayed again (no loops).
    assert all(p.bot_id == BOT_ID for p in emulator.posts(STAFF))


async def test_case_button_outside_the_staff_channel_is_refused(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    _, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    result = await emulator.click(ACTION_RESOLVE, str(row.id), message_ts=case.ts, channel=SUPPORT, user="U_CUSTOMER")
    assert result.status == 200
    await emulator.wait_for(lambda: emulator.responses)
    assert emulator.responses[-1]["text"] == "Case buttons work only in the staff channel."
    assert (await escalation_row(sessions)).status == "open"
    # And a second claim of a claimed case is politely refused too.
    await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts)
    await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts, user="U_CUSTOMER")
    await emulator.wait_for(lambda: len(emulator.responses) == 2)
    assert "already claimed by <@U_STAFF>" in emulator.responses[-1]["text"]


def test_business_hours() -> None:
    hours = BusinessHours.parse("Mon-Fri 09:00-17:00", "Europe/Berlin")
    assert hours is not None
    assert hours.is_open(datetime(2026, 11, 23, 9, 30, tzinfo=UTC))  # Monday 10:30 in Berlin
    assert not hours.is_open(datetime(2026, 11, 22, 12, 0, tzinfo=UTC))  # Sunday
    assert not hours.is_open(datetime(2026, 11, 23, 16, 30, tzinfo=UTC))  # 17:30 in Berlin
    assert BusinessHours.parse("") is None
    with pytest.raises(ValueError, match="Mon-Fri"):
        BusinessHours.parse("weekdays 9 to 5")


async def test_outside_business_hours_the_customer_is_told_when_the_team_is_back(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    settings = bot_settings(
        database_url, fake_llm, emulator, business_hours="Mon-Fri 09:00-17:00", business_timezone="Europe/Berlin"
    )
    sunday = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    async with serving(settings, emulator, clock=lambda: sunday):
        thread, _ = await escalate(emulator, fake_llm, sessions)
    texts = [p.text for p in emulator.posts(SUPPORT, thread)]
    assert texts[0].startswith("I've asked a colleague to join")
    assert texts[1] == (
        "Our team is available Mon-Fri 09:00-17:00 (Europe/Berlin); a colleague will reply as soon as they are back."
    )


async def test_case_relays_and_reminders_whose_answers_are_lost_are_posted_once(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Slack takes each post, but its answer is lost (the connection drops): the sender does not post again
    blindly; after a backoff it finds the post by the outbox id in its metadata and records it."""
    emulator.drop_next("chat.postMessage", channel=STAFF)  # the case message
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    assert [p.ts for p in emulator.posts(STAFF) if not p.thread_ts] == [case.ts] == [row.case_ts]

    emulator.drop_next("chat.postMessage", channel=STAFF)  # the customer's message, relayed to the case thread
    await emulator.user_says(SUPPORT, "hello? anyone?", thread_ts=thread)
    await settle(sessions)
    emulator.drop_next("chat.postMessage", channel=STAFF)  # the reminder
    assert await slack_bot.desk.remind(now=row.created_at + timedelta(minutes=16)) == 1
    await settle(sessions)
    emulator.drop_next("chat.postMessage", channel=SUPPORT)  # the staff reply, relayed to the customer
    await emulator.user_says(STAFF, "Sam here, sorry for the wait.", user="U_STAFF", thread_ts=case.ts)
    await settle(sessions)

    assert sum(c.dropped for c in emulator.calls_to("chat.postMessage")) == 4
    thread_posts = case_thread(emulator, case)
    assert thread_posts[0] == "*Casey Customer* (customer): hello? anyone?"
    assert len(thread_posts) == 2 and "has waited 16 min" in thread_posts[1]
    assert relays_to_customer(emulator, thread) == ["Sam here, sorry for the wait."]
    assert [c.params["channel"] for c in emulator.calls_to("chat.postMessage")].count(STAFF) == 3
    async with sessions() as s:
        rows = (await s.scalars(select(m.Outbox).where(m.Outbox.attempts > 1))).all()
    assert rows == []  # each post tried once, then found
    for post in emulator.posts(STAFF) + emulator.posts(SUPPORT):
        assert post.metadata is not None and post.metadata["event_type"] == "helpdesk_outbox"


def staff_delete(ts: str, case_ts: str) -> dict[str, Any]:
    previous = {"user": "U_STAFF", "ts": ts, "thread_ts": case_ts}
    return {"type": "message", "subtype": "message_deleted", "channel": STAFF, "hidden": True, "deleted_ts": ts} | {
        "previous_message": previous
    }


async def test_edits_and_deletions_that_arrive_before_the_relay_still_win(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """The workers are busy (another process holds the customer's conversation), so a colleague's edit, deletion
    and edit into a note all arrive before the messages they change are relayed: the customer gets the edited
    text, never the deleted one, and never the note."""
    thread, case = await escalate(emulator, fake_llm, sessions)
    async with sessions() as s:
        conversation_id = await s.scalar(select(m.Escalation.conversation_id))
    assert conversation_id is not None
    busy = Leases(sessions, owner="a-busy-worker", ttl_s=30)
    lease = await busy.claim(conversation_id)
    assert lease is not None

    price = await emulator.user_says(STAFF, "The price is $100", user="U_STAFF", thread_ts=case.ts)
    await emulator.deliver_event(staff_edit(price.ts, case.ts, "The price is $120", was="The price is $100"))
    oops = await emulator.user_says(STAFF, "Wrong customer: your card ends 4242", user="U_STAFF", thread_ts=case.ts)
    await emulator.deliver_event(staff_delete(oops.ts, case.ts))
    hunch = await emulator.user_says(STAFF, "We will refund you", user="U_STAFF", thread_ts=case.ts)
    await emulator.deliver_event(
        staff_edit(hunch.ts, case.ts, "note: maybe a refund, ask finance", was="We will refund you")
    )
    await busy.release(lease)
    await settle(sessions)

    posted = [c.params.get("text") for c in emulator.calls_to("chat.postMessage") if c.params.get("channel") == SUPPORT]
    assert not any("4242" in str(t) or "refund" in str(t) for t in posted)
    assert relays_to_customer(emulator, thread) == ["The price is $120"]
    async with sessions() as s:  # what the agents will read after a hand back: the same
        staff_lines = (await s.scalars(select(m.Message.content).where(m.Message.role == "staff"))).all()
    assert staff_lines == ["The price is $120"]


HOSTILE = "<!here> <!channel> <@U0ADMIN> <https://evil.example|driftwing.com>"
"""What a customer (or a prompt-injected model) may write: every Slack control sequence that notifies or misleads."""


def live_forms(text: str) -> list[str]:
    """Mentions, special mentions and disguised links that Slack would act on in `text`."""
    return [form for form in ("<!", "<@", "|driftwing.com>") if form in text]


async def test_untrusted_text_stays_text_in_cases_and_relays(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": f"customer asked: {HOSTILE}"})))
    said = await emulator.user_says(SUPPORT, f"I want a person {HOSTILE}")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    blocks = json.dumps(case.blocks)
    assert live_forms(case.text) == live_forms(blocks) == []
    assert "driftwing.com (<https://evil.example>)" in blocks and "&lt;!channel&gt;" in blocks  # shown, inert

    # The customer's next message, relayed into the case's thread.
    await emulator.user_says(SUPPORT, f"hello? {HOSTILE}", thread_ts=said.ts)
    [relay] = await emulator.wait_for(lambda: case_thread(emulator, case))
    assert live_forms(relay) == []
    assert relay == (
        "*Casey Customer* (customer): hello? &lt;!here&gt; &lt;!channel&gt; &lt;@U0ADMIN&gt; "
        "driftwing.com (<https://evil.example>)"
    )

    # A colleague's message (and its edit) reaches the customer's channel with no @channel in it either.
    staff = await emulator.user_says(STAFF, f"Sam here {HOSTILE}", user="U_STAFF", thread_ts=case.ts)
    [copy] = await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, said.ts) if p.username])
    assert live_forms(copy.text) == [] and copy.text.startswith("Sam here &lt;!here&gt;")
    await emulator.deliver_event(staff_edit(staff.ts, case.ts, "<!everyone> edited", was="Sam here"))
    await emulator.wait_for(lambda: "edited" in emulator.message(SUPPORT, copy.ts).text)  # type: ignore[union-attr]
    assert emulator.message(SUPPORT, copy.ts).text == "&lt;!everyone&gt; edited"  # type: ignore[union-attr]
    await settle(sessions)


async def test_a_long_reason_and_a_long_name_still_make_a_case(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Slack refuses a whole message over any Block Kit limit (`invalid_blocks`): each field is clipped instead."""
    name = ("Maximilian " * 19)[:200]  # a display name of 200 characters: a header holds 150
    emulator.add_user("U_LONG", "max", name)
    reason = ("The customer reports that the gimbal drifts after the firmware update & more; " * 40)[:2500]
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": reason})))
    await emulator.user_says(SUPPORT, "I need a person about my gimbal", user="U_LONG")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    assert emulator.rejected == []
    header, fields = case.blocks[0]["text"]["text"], case.blocks[1]["fields"]  # type: ignore[index]
    assert len(header) <= 150 and header.startswith("Case #1: Maximilian Maximilian") and header.endswith("…")
    assert fields[0]["text"] == f"*Customer*\n{name}"
    assert fields[2]["text"].startswith("*Reason*\nThe customer reports") and fields[2]["text"].endswith("…")
    assert len(fields[2]["text"]) <= 2000 and "&amp; more" in fields[2]["text"]
    await settle(sessions)
    assert (await escalation_row(sessions)).case_ts == case.ts
