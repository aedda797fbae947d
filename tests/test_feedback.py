"""Feedback on answers, CSAT after Resolve, and the App Home, over HTTP: the emulator plays Slack (clicks, the
Home tab), the fake LLM the agents, and the bot runs as it ships."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.compose import Bot
from bot.csat import ACTION_PREFIX
from bot.feedback import ACTION_FEEDBACK
from bot.playground.slack_emulator import Msg, SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.database import settle
from harness.scenarios import (
    ADMIN,
    STAFF,
    SUPPORT,
    csat_questions,
    csat_row,
    escalate,
    escalation_row,
    link,
    rated_csat,
    resolve,
    serving_as_shipped,
    shown,
    support,
    until,
)

Sessions = async_sessionmaker[AsyncSession]


async def answered(emulator: SlackEmulator, fake: FakeOpenAI, sessions: Sessions, text: str) -> tuple[str, Msg]:
    """A customer's question and the bot's answer in its thread."""
    fake.script(reply(text))
    said = await emulator.user_says(SUPPORT, "how long does the Kestrel battery last?")
    posts = await emulator.wait_for(lambda: emulator.posts(SUPPORT, said.ts))
    await settle(sessions)
    return said.ts, posts[0]


async def rate(emulator: SlackEmulator, answer: Msg, value: str, user: str) -> None:
    clicked = await emulator.click(
        ACTION_FEEDBACK, value, message_ts=answer.ts, channel=SUPPORT, user=user, element="feedback_buttons"
    )
    assert clicked.status == 200


async def feedback_rows(sessions: Sessions) -> list[m.AnswerFeedback]:
    async with sessions() as s:
        return list(await s.scalars(select(m.AnswerFeedback).order_by(m.AnswerFeedback.user_id)))


async def test_feedback_is_kept_per_person_last_click_winning_and_shown_to_admins(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, answer = await answered(emulator, fake_llm, sessions, "About 40 minutes per charge.")
    await rate(emulator, answer, "good", "U_CUSTOMER")
    await until(lambda: feedback_rows(sessions))
    await rate(emulator, answer, "bad", "U_CUSTOMER")  # changed their mind: the last click counts
    await rate(emulator, answer, "good", "U_STAFF")  # a colleague's click is no customer's verdict: not kept

    async def final() -> list[m.AnswerFeedback] | None:
        rows = await feedback_rows(sessions)
        return rows if [(r.user_id, r.rating) for r in rows] == [("U_CUSTOMER", "bad")] else None

    rows = await until(final)
    await settle(sessions)
    assert [(r.user_id, r.rating) for r in await feedback_rows(sessions)] == [("U_CUSTOMER", "bad")]
    assert {(r.agent, r.channel, r.message_ts) for r in rows} == {("triage", SUPPORT, answer.ts)}
    async with sessions() as s:
        said = await s.get(m.Message, rows[0].message_id)
    assert said is not None and said.content == "About 40 minutes per charge."
    # Nobody asked for it: no case.
    assert await escalation_count(sessions) == 0

    stats = shown(await support(emulator, "stats"))
    assert "👎 1" in stats and "triage" in stats
    audit = shown(await support(emulator, f"show {link(SUPPORT, thread)}"))
    assert "👎 <@U_CUSTOMER> on triage's answer" in audit and "U_STAFF" not in audit


async def escalation_count(sessions: Sessions) -> int:
    async with sessions() as s:
        return len((await s.scalars(select(m.Escalation.id))).all())


async def test_a_thumbs_down_opens_a_case_when_configured(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    async with serving_as_shipped(database_url, fake_llm, emulator, feedback_escalate_on_bad=True):
        await thumbs_down_escalates(emulator, fake_llm, sessions)


async def thumbs_down_escalates(emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions) -> None:
    thread, answer = await answered(emulator, fake_llm, sessions, "Just restart it.")
    await rate(emulator, answer, "bad", "U_STAFF")  # a colleague's 👎 opens nothing
    await rate(emulator, answer, "good", "U_CUSTOMER")  # nor does a 👍
    await until(lambda: feedback_rows(sessions))
    await settle(sessions)
    assert await escalation_count(sessions) == 0
    await rate(emulator, answer, "bad", "U_CUSTOMER")
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    row = await escalation_row(sessions)
    assert (row.trigger, row.reason, row.customer, row.agent) == (
        "feedback", "customer rated an answer 👎", "U_CUSTOMER", "triage"
    )  # fmt: skip
    assert "customer rated an answer 👎" in json.dumps(case[0].blocks, ensure_ascii=False)
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("I've asked a colleague to join")
    # The conversation is with people now: another 👎 opens no second case.
    await rate(emulator, answer, "good", "U_CUSTOMER")
    await rate(emulator, answer, "bad", "U_CUSTOMER")
    await until(lambda: _rated_bad_by(sessions, "U_CUSTOMER"))
    await settle(sessions)
    assert await escalation_count(sessions) == 1


async def _rated_bad_by(sessions: Sessions, user: str) -> bool:
    return any(r.user_id == user and r.rating == "bad" for r in await feedback_rows(sessions))


async def test_csat_is_asked_once_after_resolve_recorded_and_not_asked_again_within_the_cooldown(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await resolve(emulator, sessions, case)
    texts = [p.text for p in emulator.posts(SUPPORT, thread)]
    assert texts[-2].startswith("This conversation is now closed") and texts[-1].startswith("How did we do?")
    [question] = csat_questions(emulator, thread)
    assert question.blocks is not None
    buttons = [e for b in question.blocks if b["type"] == "actions" for e in b["elements"]]
    assert [(b["action_id"], b["value"]) for b in buttons] == [
        (f"{ACTION_PREFIX}{n}", str(row.id)) for n in range(1, 6)
    ]

    # Only the customer's rating counts; theirs is stored with the case's agent, trigger and who resolved it.
    await emulator.click(f"{ACTION_PREFIX}1", str(row.id), message_ts=question.ts, channel=SUPPORT, user="U_STAFF")
    await emulator.click(f"{ACTION_PREFIX}4", str(row.id), message_ts=question.ts, channel=SUPPORT, user="U_CUSTOMER")
    rated = await until(lambda: rated_csat(sessions, row.id))
    assert (rated.rating, rated.customer, rated.agent, rated.trigger, rated.resolved_by) == (
        4, "U_CUSTOMER", "triage", "agent", "U_STAFF"
    )  # fmt: skip
    answers = await emulator.wait_for(lambda: emulator.response_log)
    assert [(r.user, r.body["text"]) for r in answers] == [
        ("U_STAFF", "Only the customer whose conversation it was can rate it.")
    ]
    # The customer is thanked by the comment modal (tests/test_csat_comment.py).
    assert [modal.user for modal in await emulator.wait_for(lambda: list(emulator.modals.values()))] == ["U_CUSTOMER"]

    # The same customer's next case, resolved within the cooldown: not asked again.
    fake_llm.reset()
    second_thread, second_case = await escalate_again(emulator, fake_llm, sessions)
    second = await resolve(emulator, sessions, second_case)
    assert second.id != row.id and csat_questions(emulator, second_thread) == []
    assert await csat_row(sessions, second.id) is None

    stats = shown(await support(emulator, "stats"))
    assert "4.0/5 from 1 rating(s), 1 asked" in stats
    assert "*CSAT by agent*: triage 4.0 (1)" in stats and "*CSAT by trigger*: agent 4.0 (1)" in stats
    assert "*CSAT by staff member*: <@U_STAFF> 4.0 (1)" in stats


async def escalate_again(emulator: SlackEmulator, fake: FakeOpenAI, sessions: Sessions) -> tuple[str, Msg]:
    """`escalate`, in a new thread, with a case message of its own."""
    before = {p.ts for p in emulator.posts(STAFF) if not p.thread_ts}
    fake.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    said = await emulator.user_says(SUPPORT, "a person please, about another order")
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts and p.ts not in before])
    await settle(sessions)
    return said.ts, case[0]


async def test_csat_off_asks_nothing(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    async with serving_as_shipped(database_url, fake_llm, emulator, csat=False):
        thread, case = await escalate(emulator, fake_llm, sessions)
        row = await resolve(emulator, sessions, case)
    assert csat_questions(emulator, thread) == [] and await csat_row(sessions, row.id) is None


async def test_app_home_shows_numbers_to_admins_and_staff_and_a_plain_home_to_others(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    _, answer = await answered(emulator, fake_llm, sessions, "About 40 minutes per charge.")
    await rate(emulator, answer, "bad", "U_CUSTOMER")
    await until(lambda: feedback_rows(sessions))
    for user in (ADMIN, "U_STAFF", "U_CUSTOMER"):
        assert (await emulator.app_home_opened(user)).status == 200
    homes = await emulator.wait_for(lambda: len(emulator.homes) == 3 and emulator.homes)
    for insider in (ADMIN, "U_STAFF"):
        home = json.dumps(homes[insider]["blocks"], ensure_ascii=False)
        assert "Helpdesk today" in home and "*Conversations*\\n1 active, 1 new" in home
        assert "👍 0 · 👎 1" in home and "0 open, 0 claimed" in home and "*Median time to claim*" in home
        assert "*LLM provider*" in home and "*Knowledge*" in home and "*Paused*\\nnone" in home
    plain = json.dumps(homes["U_CUSTOMER"]["blocks"])
    assert "This is the helpdesk bot" in plain and "Conversations" not in plain
    # Nothing of it went through the durable inbox: no customer message, no turn.
    async with sessions() as s:
        assert len((await s.scalars(select(m.Inbound.id))).all()) == 1
