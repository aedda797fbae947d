"""Nothing lost in silence: a case the staff channel will not take is retried while that can help, reaches the
admins by direct message, falls back to plain text when Slack refuses its layout, and, given up, is its own state
(counted in /metrics and `/support status`, never as sent) and the customer is told. Over HTTP: the emulator
plays Slack (refusing posts where Slack would), the fake LLM the agents."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DBAPIError

from agents.conversations import SET_ASIDE, Conversations, MessageResult, ResultKind, TurnCommit
from agents.db import models as m
from agents.db.deliveries import CasePost, Outcome
from agents.db.statements import Statement
from agents.identity import Author
from bot.playground.slack_emulator import SlackEmulator
from escalation.machine import TAKEOVER, Mode
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import Sessions, settle
from harness.llm import CONFIG
from harness.sample import default_roster
from harness.scenarios import ADMIN, STAFF, SUPPORT, shown, support

UNREACHABLE = "I'm sorry: I could not reach a colleague just now."
DISK_FULL = text("DO $$ BEGIN RAISE EXCEPTION 'No space left on device' USING ERRCODE = 'disk_full'; END $$")


@pytest.fixture
async def admin_bot(database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator) -> Any:
    """`sessions` first: its tables are emptied before the bot starts using them (else the two can deadlock)."""
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    async with serving(bot_settings(database_url, fake_llm, emulator, admin_user_ids=ADMIN), emulator) as bot:
        yield bot


async def ask_for_a_person(emulator: SlackEmulator, fake: FakeOpenAI, reason: str = "customer asked") -> str:
    fake.script(tools(tool_call("escalate_to_human", {"reason": reason})))
    said = await emulator.user_says(SUPPORT, "can I talk to a person please?")
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, said.ts))
    return said.ts


async def case_row(sessions: Sessions) -> m.Outbox:
    async with sessions() as s:
        row = await s.scalar(select(m.Outbox).where(m.Outbox.kind == CasePost.kind))
    assert row is not None
    return row


async def fast_forward(sessions: Sessions, *, minutes: float = 0) -> None:
    """The outbox's backoff waited out, and the rows `minutes` older (the case's patience)."""
    async with sessions() as s, s.begin():
        await s.execute(
            update(m.Outbox)
            .where(m.Outbox.done_at.is_(None))
            .values(next_attempt_at=func.now(), created_at=m.Outbox.created_at - timedelta(minutes=minutes))
        )


def dms_to(emulator: SlackEmulator, user: str) -> list[str]:
    return [p.text for p in emulator.posts(f"D{user}")]


async def metric(bot: Any, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/metrics") as response:
        body = await response.text()
    return sum(float(line.split()[-1]) for line in body.splitlines() if line.startswith(name + " "))


async def test_a_case_waits_for_the_bot_to_be_invited_and_the_admins_are_told_at_once(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.add_channel(STAFF, "#staff", is_member=False, is_private=True)
    thread = await ask_for_a_person(emulator, fake_llm)
    problem = await emulator.wait_for(lambda: dms_to(emulator, ADMIN))
    assert "could not post case #" in problem[0] and "not_in_channel" in problem[0] and "Invite me" in problem[0]
    row = await case_row(sessions)
    assert row.done_at is None and row.last_error == "not_in_channel"  # waiting, not given up

    emulator.add_channel(STAFF, "#staff", is_private=True)  # someone invites the bot
    await fast_forward(sessions)
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    assert (await case_row(sessions)).outcome == Outcome.SENT and case[0].blocks
    assert [p.text for p in emulator.posts(SUPPORT, thread)] == [
        "I've asked a colleague to join. A person will reply here shortly."
    ]
    assert await metric(admin_bot, "helpdesk_outbox_given_up") == 0


async def test_a_case_that_cannot_be_posted_is_given_up_seen_and_the_customer_told(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    del emulator.channels[STAFF]  # STAFF_CHANNEL_ID names no channel (a typo)
    thread = await ask_for_a_person(emulator, fake_llm)
    await emulator.wait_for(lambda: dms_to(emulator, ADMIN))

    def told() -> list[str]:
        return [p.text for p in emulator.posts(SUPPORT, thread) if UNREACHABLE in p.text]

    for _ in range(40):  # three tries at least, and past the case's patience
        await fast_forward(sessions, minutes=11)
        await asyncio.sleep(0.25)
        if told():
            break
    await settle(sessions)
    assert len(told()) == 1 and len(dms_to(emulator, ADMIN)) == 2  # the problem, then the case given up
    async with sessions() as s:  # back with the bot: the customer's next message is answered, not relayed nowhere
        mode = await s.scalar(select(m.Conversation.mode))
        status = await s.scalar(select(m.Escalation.status))
    assert (mode, status) == ("bot", "handed_back")

    row = await case_row(sessions)
    assert (row.outcome, row.last_error) == (Outcome.GIVEN_UP, "channel_not_found")
    given_up_dm = dms_to(emulator, ADMIN)[-1]
    assert "gave up posting case #" in given_up_dm and "can I talk to a person please?" in given_up_dm
    assert await metric(admin_bot, "helpdesk_outbox_given_up") == 1  # the first scrape: the gauges are fresh
    async with sessions() as s:
        sent_rows = await s.scalar(select(func.count()).where(m.Outbox.outcome == Outcome.SENT))
    # Every call counted as sent was sent: the case is not among them.
    assert await metric(admin_bot, "helpdesk_outbox_sent_total") == sent_rows
    status = shown(await support(emulator, "status", channel=SUPPORT))
    assert "1 Slack call(s) given up" in status and "channel_not_found" in status
    assert "STAFF_CHANNEL_ID C_STAFF: no such channel" in status


async def test_a_case_whose_layout_slack_refuses_is_posted_as_text(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.fail_next("chat.postMessage", status=200, error="invalid_blocks", channel=STAFF)
    await ask_for_a_person(emulator, fake_llm, reason="the customer wants a refund of a damaged drone")
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    assert case[0].blocks is None and "the customer wants a refund of a damaged drone" in case[0].text
    assert (await case_row(sessions)).outcome == Outcome.SENT
    assert dms_to(emulator, ADMIN) == []


async def test_an_externally_shared_staff_channel_stops_the_bot(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    from bot.slack.preflight import RefusedToStart

    emulator.add_channel(STAFF, "#staff", is_ext_shared=True)
    with pytest.raises(RefusedToStart, match="shared with another organisation"):
        async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
            pass


# --- dead letters: a message that fails every way it can be handled is set aside, and the conversation moves on --


async def work_through(service: Conversations, *, until: int) -> list[MessageResult]:
    """As the workers do: claim what waits, run it, a failure leaves it for later; until `until` results."""
    results: list[MessageResult] = []
    for _ in range(200):
        for lease in await service.leases.claim_pending(10):
            with contextlib.suppress(RuntimeError):
                results += await service.run_leased(lease)
        if len(results) >= until:
            break
        await asyncio.sleep(0.02)
    return results


def failing_host(sessions: Sessions, model: Any, host: Any) -> Conversations:
    """The engine with a host hook that fails where the test says, retrying after a hundredth of a second."""
    roster = default_roster()
    return Conversations(
        takeover=TAKEOVER,
        sessions=sessions,
        roster=roster,
        model=model,
        config=CONFIG,
        after_turn=host,
        retry_base_s=0.01,
    )


async def test_a_poison_message_is_set_aside_and_other_conversations_are_answered(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    """The host's rows for one conversation cannot be written, on the turn and on the apology alike (as an
    unknown template placeholder once did): after the attempts and the apology it is set aside, counted, and the
    conversation's next message is answered; another conversation is answered meanwhile, on the first pass."""

    async def host(s: Any, commit: TurnCommit) -> None:
        if commit.key == "poison" and "first" in commit.text:
            raise RuntimeError("the host cannot write this message's rows")

    fake_llm.rule = lambda _: reply("Happy to help.")
    service = failing_host(sessions, model, host)
    poison = await service.submit("poison", "the first message")
    await service.submit("poison", "a second message")
    healthy = await service.submit("healthy", "hello")
    results = await work_through(service, until=3)
    by_message = {r.inbound_id: r for r in results}
    assert by_message[healthy.inbound_id].kind == ResultKind.REPLY
    assert by_message[poison.inbound_id].kind == ResultKind.SET_ASIDE
    assert [r.kind for r in results if r.conversation_id == poison.conversation_id] == [
        ResultKind.SET_ASIDE,
        ResultKind.REPLY,
    ]
    async with sessions() as s:
        first = await s.get(m.Inbound, poison.inbound_id)
        set_aside = await s.scalar(select(func.count()).select_from(m.Inbound).where(SET_ASIDE))
    assert first is not None and first.attempts == service.max_attempts + 2 and set_aside == 1


async def test_a_failing_staff_message_is_set_aside_without_an_apology_loop(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    """A colleague's message has no apology to fall back on: after `max_attempts` it is set aside (before, it was
    tried for ever)."""

    async def host(s: Any, commit: TurnCommit) -> None:
        if commit.result.kind == ResultKind.STAFF:
            raise RuntimeError("cannot relay")

    service = failing_host(sessions, model, host)
    async with sessions() as s, s.begin():
        staff = await service.submit_in(
            s, "C1:1.0", "we are on it", author=Author("slack", "T1", "U_STAFF"), external_id="9.9", kind="staff"
        )
        conversation = await s.get(m.Conversation, staff.conversation_id)
        assert conversation is not None
        conversation.mode = Mode.HUMAN
        s.add(m.Escalation(conversation_id=staff.conversation_id, reason="r", trigger="tool", agent="triage"))
    results = await work_through(service, until=1)
    assert [r.kind for r in results] == [ResultKind.SET_ASIDE]
    async with sessions() as s:
        row = await s.get(m.Inbound, staff.inbound_id)
    assert row is not None and row.attempts == service.max_attempts + 1


DISK_FULL = Statement("DO $$ BEGIN RAISE EXCEPTION 'No space left on device' USING ERRCODE = 'disk_full'; END $$")


async def test_a_turn_the_database_cannot_store_is_answered_once_it_can_not_apologised_for(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    """A full disk (SQLSTATE 53100, raised by the server) refuses the turn's commit more times than `max_attempts`:
    the database's failures are not the message's, so once the disk has room the model's answer is stored. Before,
    a disk full for some seconds used up the attempts, and customers whose answers were ready got the apology and a
    person."""
    refusals = 4

    async def host(s: Any, commit: TurnCommit) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            await DISK_FULL.run(s, {})

    fake_llm.rule = lambda _: reply("Happy to help.")
    service = failing_host(sessions, model, host)
    await service.submit("disk", "hello")
    results: list[MessageResult] = []
    for _ in range(300):
        for lease in await service.leases.claim_pending(10):
            with contextlib.suppress(DBAPIError):
                results += await service.run_leased(lease)
        if results:
            break
        await asyncio.sleep(0.02)
    assert refusals == 0
    assert [r.kind for r in results] == [ResultKind.REPLY]
    assert fake_llm.calls == 5  # every attempt a turn: none given up without one
