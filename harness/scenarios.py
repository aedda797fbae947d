"""Slack scenarios several test modules play through the emulator and the fake LLM: a case escalated by the agent
and resolved by staff, `/support` run by an admin, the bot as it ships (an admin, a staff allow-list, CSAT on),
and what each leaves in the database to look at."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from sqlalchemy import select

from agents.db import models as m
from bot.compose import Bot
from bot.playground.slack_emulator import Msg, SlackEmulator
from escalation.views import ACTION_RESOLVE
from fakes.openai_server import FakeOpenAI, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import Sessions, settle

STAFF, SUPPORT = "C_STAFF", "C_SUPPORT"
ADMIN = "U_ADMIN"
T = TypeVar("T")


def serving_as_shipped(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, **extra: Any
) -> AbstractAsyncContextManager[Bot]:
    """The bot with an admin, a staff allow-list and CSAT on (as it ships), and `extra` settings."""
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    values = {"admin_user_ids": ADMIN, "staff_user_ids": "U_STAFF", "csat": True} | extra
    settings = bot_settings(database_url, fake_llm, emulator, **values)
    return serving(settings, emulator)


async def until(look: Callable[[], Awaitable[T | None]], timeout_s: float = 10.0) -> T:
    """What `look` finds, once it finds something (the bot acts on a click after acknowledging it)."""
    for _ in range(round(timeout_s / 0.05)):
        if found := await look():
            return found
        await asyncio.sleep(0.05)
    raise TimeoutError("never found")


# --- A case: escalated, relayed, resolved, rated --------------------------------------------------------------


async def escalate(emulator: SlackEmulator, fake: FakeOpenAI, sessions: Sessions) -> tuple[str, Msg]:
    """A customer asks for a person in their own words; the agent escalates; the case appears for staff."""
    fake.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    said = await emulator.user_says(SUPPORT, "this is going nowhere, can I talk to an actual human being?")
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    return said.ts, case[0]


async def escalation_row(sessions: Sessions) -> m.Escalation:
    async with sessions() as s:
        row = await s.scalar(select(m.Escalation).order_by(m.Escalation.id.desc()))
    assert row is not None
    return row


def relays_to_customer(emulator: SlackEmulator, thread: str) -> list[str]:
    return [p.text for p in emulator.posts(SUPPORT, thread) if p.username]


async def resolve(emulator: SlackEmulator, sessions: Sessions, case: Msg) -> m.Escalation:
    row = await escalation_row(sessions)
    assert (await emulator.click(ACTION_RESOLVE, str(row.id), message_ts=case.ts)).status == 200
    await until(lambda: _status_is(sessions, row.id, "resolved"))
    await settle(sessions)
    return row


async def _status_is(sessions: Sessions, escalation_id: int, status: str) -> bool:
    async with sessions() as s:
        row = await s.get(m.Escalation, escalation_id)
        return row is not None and row.status == status


def csat_questions(emulator: SlackEmulator, thread: str) -> list[Msg]:
    return [p for p in emulator.posts(SUPPORT, thread) if p.blocks and "csat_" in json.dumps(p.blocks)]


async def csat_row(sessions: Sessions, escalation_id: int) -> m.Csat | None:
    async with sessions() as s:
        return await s.scalar(select(m.Csat).where(m.Csat.escalation_id == escalation_id))


async def rated_csat(sessions: Sessions, escalation_id: int) -> m.Csat | None:
    """The case's CSAT row once its customer has rated it, else None."""
    row = await csat_row(sessions, escalation_id)
    return row if row is not None and row.rating is not None else None


# --- `/support` -------------------------------------------------------------------------------------------------


async def support(emulator: SlackEmulator, text: str, *, user: str = ADMIN, channel: str = STAFF) -> dict[str, Any]:
    """Run `/support <text>`: the ack is empty and immediate; the answer arrives on the response_url."""
    before = len(emulator.response_log)
    ack = await emulator.slash_command("/support", text, user=user, channel=channel)
    assert (ack.status, ack.body) == (200, "")
    answers = await emulator.wait_for(lambda: emulator.response_log[before:])
    assert len(answers) == 1 and (answers[0].user, answers[0].channel, answers[0].source) == (user, channel, "/support")
    body = answers[0].body
    assert body["response_type"] == "ephemeral" and body["blocks"][0]["type"] == "header"
    return body


def shown(body: dict[str, Any]) -> str:
    """Everything the admin sees, as one string."""
    return json.dumps(body["blocks"], ensure_ascii=False)


def link(channel: str, ts: str, thread_ts: str | None = None) -> str:
    url = f"https://driftwing.slack.com/archives/{channel}/p{ts.replace('.', '')}"
    url += f"?thread_ts={thread_ts}&cid={channel}" if thread_ts else ""
    return f"<{url}>"  # as Slack escapes it (should_escape: true)
