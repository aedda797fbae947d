"""Slack Connect: who is staff in a customer's thread. A colleague (our workspace's member in a shared channel, a
STAFF_TEAM_IDS workspace's member, a STAFF_EMAIL_DOMAINS email) who writes there takes the conversation over; a
member of another organisation and a guest are customers. Over HTTP: the emulator plays Slack, the fake LLM the
agents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.declaration.build import SAMPLE, with_declaration
from bot.declaration.parse import load
from bot.playground.slack_emulator import SlackEmulator
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import case_known, settle

Sessions = async_sessionmaker[AsyncSession]
STAFF, SHARED = "C_STAFF", "C_SHARED"


def connect(emulator: SlackEmulator) -> None:
    """A channel shared with Acme (Slack Connect), Acme's Avery in it, and a guest of our own workspace."""
    emulator.add_channel(SHARED, "#acme-driftwing", is_ext_shared=True)
    emulator.add_user("U_ACME", "avery", "Avery Acme", team_id="T_ACME", email="avery@acme.test")
    emulator.add_user("U_GUEST", "gil", "Gil Guest", guest="multi", email="gil@driftwing.example")


async def asks(emulator: SlackEmulator, fake: FakeOpenAI, text: str, *, user: str = "U_ACME") -> str:
    """A customer's new thread in the shared channel, answered by the bot; its ts."""
    fake.script(reply(f"Answer to: {text}"))
    said = await emulator.user_says(SHARED, text, user=user)
    await emulator.wait_for(lambda: emulator.posts(SHARED, said.ts))
    return said.ts


async def cases(sessions: Sessions) -> list[m.Escalation]:
    async with sessions() as s:
        return list(await s.scalars(select(m.Escalation).order_by(m.Escalation.id)))


async def mode_of(sessions: Sessions, thread: str) -> str:
    async with sessions() as s:
        mode = await s.scalar(select(m.Conversation.mode).where(m.Conversation.key.endswith(f":{SHARED}:{thread}")))
    assert mode is not None
    return mode


def case_posts(emulator: SlackEmulator) -> list[Any]:
    return [p for p in emulator.posts(STAFF) if not p.thread_ts]


def users_info(emulator: SlackEmulator, user: str) -> int:
    return sum(1 for c in emulator.calls_to("users.info") if c.params.get("user") == user)


async def test_a_colleague_in_a_shared_customer_thread_takes_it_over_and_others_are_customers(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    connect(emulator)
    emulator.add_user("U_BETA", "bo", "Bo Beta", team_id="T_BETA")
    thread = await asks(emulator, fake_llm, "My Kestrel drifts left")
    # Another organisation's member, and a guest of ours (with an email at our domain), are customers: answered.
    for user in ("U_BETA", "U_GUEST"):
        fake_llm.script(reply(f"Hello {user}"))
        await emulator.user_says(SHARED, "Mine too", user=user, thread_ts=thread)
        await emulator.wait_for(lambda user=user: emulator.posts(SHARED, thread)[-1].text == f"Hello {user}")
    # In a channel that is not shared (a community workspace), our own members are customers too.
    fake_llm.script(reply("Answer for Sam"))
    elsewhere = await emulator.user_says("C_SUPPORT", "Does the Harrier fold?", user="U_STAFF")
    await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", elsewhere.ts))
    await settle(sessions)
    assert fake_llm.calls == 4 and await cases(sessions) == []

    colleague = await emulator.user_says(
        SHARED, "Hi Avery, Sam here: I'll take this one.", user="U_STAFF", thread_ts=thread
    )
    case = (await emulator.wait_for(lambda: case_posts(emulator)))[0]
    await settle(sessions)
    # No AI answer to the colleague, nothing relayed (the customer saw it in the thread; staff see the case).
    assert fake_llm.calls == 4 and len(emulator.posts(SHARED, thread)) == 3
    assert not [p for p in emulator.messages(SHARED) if p.username]
    assert not emulator.posts(STAFF, case.ts)[1:]
    assert not emulator.message(SHARED, colleague.ts).reactions  # type: ignore[union-attr]
    (row,) = await cases(sessions)
    # The case is the last customer's who wrote in the thread (as a customer's escalation is its writer's).
    assert (row.status, row.claimed_by, row.customer, row.trigger) == ("claimed", "U_STAFF", "U_GUEST", "colleague")
    assert row.claimed_at is not None and row.first_response_at is not None and row.case_ts == case.ts
    blocks = json.dumps(case.blocks)
    assert "Gil Guest" in blocks and "Claimed by <@U_STAFF>" in blocks
    assert await mode_of(sessions, thread) == "human"
    async with sessions() as s:
        said = list(await s.execute(select(m.Message.role, m.Message.author).order_by(m.Message.id)))
    assert [tuple(r) for r in said][-1] == ("staff", "U_STAFF")

    # The customer's follow-up reaches the case thread; the bot stays quiet, and asks Slack nothing new.
    await emulator.user_says(SHARED, "thanks, it's firmware 1.4", user="U_ACME", thread_ts=thread)
    relayed = await emulator.wait_for(lambda: [p.text for p in emulator.posts(STAFF, case.ts)[1:]])
    assert relayed == ["*Avery Acme* (customer): thanks, it's firmware 1.4"]
    # A colleague's later message keeps it with humans: no answer, no relay, no second case.
    await emulator.user_says(SHARED, "Update it to 1.5 and recalibrate.", user="U_STAFF", thread_ts=thread)
    await settle(sessions)
    assert fake_llm.calls == 4 and len(emulator.posts(SHARED, thread)) == 3
    assert len(emulator.posts(STAFF, case.ts)) == 2 and len(await cases(sessions)) == 1
    assert users_info(emulator, "U_ACME") == 1 and users_info(emulator, "U_STAFF") == 1


async def test_a_colleague_claims_the_open_case_of_the_thread(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    connect(emulator)
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    said = await emulator.user_says(SHARED, "I need a human, please", user="U_ACME")
    case = (await emulator.wait_for(lambda: case_posts(emulator)))[0]
    await settle(sessions)
    assert (await cases(sessions))[0].status == "open"

    await emulator.user_says(SHARED, "I'm here, Avery.", user="U_STAFF", thread_ts=said.ts)
    await settle(sessions)
    (row,) = await cases(sessions)
    assert (row.status, row.claimed_by) == ("claimed", "U_STAFF") and row.first_response_at is not None
    assert "Claimed by <@U_STAFF>" in json.dumps(emulator.message(STAFF, case.ts).blocks)  # type: ignore[union-attr]
    assert len(case_posts(emulator)) == 1 and not emulator.posts(STAFF, case.ts)[1:]  # updated, not relayed
    assert fake_llm.calls == 1


async def test_staff_teams_and_email_domains_are_colleagues(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """A listed workspace's member is a colleague; a staff-domain email counts only for a member of our own
    workspace: another organisation's member (whose profile email that organisation controls) stays a customer."""
    connect(emulator)
    emulator.add_user("U_PARTNER", "pat", "Pat Partner", team_id="T_PARTNER")
    emulator.add_user("U_OUTSIDER", "jo", "Jo Outsider", team_id="T_AGENCY", email="jo@Driftwing.example")
    emulator.add_user("U_EMP", "em", "Em Employee", email="em@Driftwing.example")
    settings = bot_settings(
        database_url, fake_llm, emulator, staff_team_ids="T_PARTNER", staff_email_domains="driftwing.example"
    )
    async with serving(settings, emulator):
        threads = [await asks(emulator, fake_llm, f"Question {n}") for n in range(3)]
        # A guest whose email is at a staff domain stays a customer; so does another organisation's member.
        for user, name in (("U_GUEST", "Gil"), ("U_OUTSIDER", "Jo")):
            fake_llm.script(reply(f"Hello {name}"))
            await emulator.user_says(SHARED, "Any news?", user=user, thread_ts=threads[2])
            await emulator.wait_for(lambda n=name: emulator.posts(SHARED, threads[2])[-1].text == f"Hello {n}")
        for user, thread in zip(("U_PARTNER", "U_EMP"), threads, strict=False):
            await emulator.user_says(SHARED, "Our team has this.", user=user, thread_ts=thread)
        await emulator.wait_for(lambda: len(case_posts(emulator)) == 2)
        await settle(sessions)
    # Two conversations taken over at once: their cases are made in whichever order they were handled.
    assert sorted((c.claimed_by, c.customer) for c in await cases(sessions)) == [
        ("U_EMP", "U_ACME"),
        ("U_PARTNER", "U_ACME"),
    ]
    assert fake_llm.calls == 5
    assert [await mode_of(sessions, t) for t in threads] == ["human", "human", "bot"]


async def test_the_staff_name_suffix_is_a_setting(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, tmp_path: Path
) -> None:
    settings = bot_settings(database_url, fake_llm, emulator, staff_name_suffix=" · Support")
    async with serving(settings, emulator):
        fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
        said = await emulator.user_says("C_SUPPORT", "a person, please")
        case = (await emulator.wait_for(lambda: case_posts(emulator)))[0]
        await case_known(sessions, case.ts)
        await emulator.user_says(STAFF, "Sam here.", user="U_STAFF", thread_ts=case.ts)
        relayed = await emulator.wait_for(lambda: [p for p in emulator.posts("C_SUPPORT", said.ts) if p.username])
        await settle(sessions)
    assert relayed[0].username == "Sam Staff · Support"
    # Empty means no suffix (where other blank variables mean "not set").
    (tmp_path / ".env").write_text("STAFF_NAME_SUFFIX=\nHANDOFF_NOTICE=\n")
    read = Settings(_env_file=tmp_path / ".env")  # type: ignore[call-arg]
    assert (read.staff_name_suffix, read.handoff_notice) == ("", None)
    # Unset: the declaration's brand signs for the team.
    unset = Settings(_env_file=None)  # type: ignore[call-arg]
    assert unset.staff_name_suffix is None
    assert with_declaration(unset, load(SAMPLE)).staff_name_suffix == " (Driftwing team)"
    assert with_declaration(read, load(SAMPLE)).staff_name_suffix == ""
