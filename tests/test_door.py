"""The door (issue 13): monitoring on a listener of its own behind a token, scrapes that read no table, who counts
as staff (never guests or other organisations' members; only the allow-list when there is one), and slash
commands and clicks acted on once however often they are replayed. Over HTTP, against the emulator."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.playground.slack_emulator import SlackEmulator
from bot.settings import Settings
from bot.slack.preflight import RefusedToStart
from escalation.views import ACTION_CLAIM
from fakes.openai_server import FakeOpenAI, reply
from harness.bot import bot_settings, free_port, serving
from harness.database import settle
from harness.scenarios import STAFF, SUPPORT, escalate, escalation_row, relays_to_customer
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
TOKEN = "scrape-token"


async def get(url: str, *, token: str | None = None, timeout_s: float = 10) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url, headers=headers) as response:
        return response.status, await response.text()


async def test_health_and_metrics_only_on_their_own_listener_and_only_with_the_token(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: Sessions
) -> None:
    settings = bot_settings(database_url, fake_llm, emulator, metrics_port=free_port(), metrics_token=TOKEN)
    async with serving(settings, emulator) as bot:
        assert bot.monitoring_url != bot.url and bot.monitoring_url.startswith("http://127.0.0.1:")
        for path in ("/healthz", "/metrics"):
            assert (await get(bot.url + path, token=TOKEN))[0] == 404  # not on the public port
            assert (await get(bot.monitoring_url + path))[0] == 401
            assert (await get(bot.monitoring_url + path, token=TOKEN + "x"))[0] == 401
            assert (await get(bot.monitoring_url + path, token=TOKEN[:-1]))[0] == 401
            assert (await get(bot.monitoring_url + path, token=TOKEN))[0] == 200
        assert "helpdesk_inbox_backlog 0.0" in (await get(bot.monitoring_url + "/metrics", token=TOKEN))[1]
        # A load balancer that reaches only the public port still learns that the process is up, and no more.
        assert await get(bot.url + "/livez") == (200, '{"ready": true}')
        async with aiohttp.ClientSession() as http, http.post(f"{bot.monitoring_url}/slack/events") as events:
            assert events.status == 404  # and Slack's requests are not served on the monitoring port
        # The bot still works on the public port.
        fake_llm.script(reply("hello there"))
        said = await emulator.user_says(SUPPORT, "hi")
        assert await replies_in(emulator, SUPPORT, said.ts, 1) == ["hello there"]


async def test_monitoring_is_private_when_nothing_is_configured(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """Issue 26: with no METRICS_* set, what the database and the model are doing is not told to whoever reaches
    the public port; it is told on loopback. (The tests' bots take any free port instead of the fixed default, so
    that they can run side by side: the only thing changed from nothing-configured.)"""
    fields = Settings.model_fields
    assert (fields["metrics_port"].default, fields["metrics_host"].default) == (3001, "127.0.0.1")
    assert fields["metrics_token"].default is None and fields["port"].default != fields["metrics_port"].default
    settings = bot_settings(database_url, fake_llm, emulator, metrics_port=0)
    async with serving(settings, emulator) as bot:
        assert bot.monitoring_url != bot.url and bot.monitoring_url.startswith("http://127.0.0.1:")
        for path in ("/healthz", "/metrics"):
            assert (await get(bot.url + path))[0] == 404
            assert (await get(bot.monitoring_url + path))[0] == 200
        assert await get(bot.url + "/livez") == (200, '{"ready": true}')


async def test_monitoring_on_the_public_port_only_behind_the_token(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """METRICS_PORT=PORT (a platform that exposes one port) serves them beside Slack's requests, and only with
    METRICS_TOKEN: without it the bot does not start."""
    port = free_port()
    with pytest.raises(ValidationError, match="METRICS_TOKEN"):
        bot_settings(database_url, fake_llm, emulator, port=port, metrics_port=port)
    settings = bot_settings(database_url, fake_llm, emulator, port=port, metrics_port=port, metrics_token=TOKEN)
    async with serving(settings, emulator) as bot:
        assert bot.monitoring_url == bot.url
        for path in ("/healthz", "/metrics"):
            assert (await get(bot.url + path))[0] == 401
            assert (await get(bot.url + path, token=TOKEN))[0] == 200


async def test_a_taken_monitoring_port_refuses_the_start_and_says_which(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """Two bot processes on one host (web and worker) with the same METRICS_PORT: the second is told which
    variable to change, rather than dying on a bare OSError."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = bot_settings(database_url, fake_llm, emulator, metrics_port=port)
        with pytest.raises(RefusedToStart, match=f"127.0.0.1:{port} .*own METRICS_PORT, or METRICS_PORT=0"):
            async with serving(settings, emulator):
                pass


@pytest.fixture
async def locker(engine: AsyncEngine, sessions: Sessions) -> AsyncIterator[Any]:
    """Takes tables in ACCESS EXCLUSIVE mode until the test ends: whatever reads them waits."""
    conn = await engine.connect()
    transaction = await conn.begin()

    async def lock(*tables: str) -> None:
        await conn.execute(text(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE"))

    try:
        yield lock
    finally:
        await transaction.rollback()
        await conn.close()


async def test_a_scrape_reads_no_table_and_counts_right(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions, locker: Any
) -> None:
    """Totals are this process's running counters and gauges a cache: with llm_calls locked every scrape still
    answers at once, and so do scrapes within the cache's lifetime with every gauge's table locked too."""
    fake_llm.script(reply("one"), reply("two"))
    for question in ("first?", "second?"):
        said = await emulator.user_says(SUPPORT, question)
        await replies_in(emulator, SUPPORT, said.ts, 1)
    await settle(sessions)
    async with sessions() as s:
        calls, prompt, completion = (
            await s.execute(
                select(func.count(), func.sum(m.LLMCall.prompt_tokens), func.sum(m.LLMCall.completion_tokens))
            )
        ).one()
    assert calls == 2 and prompt > 0 and completion > 0
    expected = [
        "helpdesk_llm_calls_total 2.0",
        f"helpdesk_llm_prompt_tokens_total {float(prompt)}",
        f"helpdesk_llm_completion_tokens_total {float(completion)}",
        "helpdesk_inbox_backlog 0.0",
        "helpdesk_outbox_backlog 0.0",
        "helpdesk_open_escalations 0.0",
    ]
    url = f"{slack_bot.monitoring_url}/metrics"
    await locker("llm_calls")
    status, first = await get(url, timeout_s=3)
    assert status == 200 and all(line in first.splitlines() for line in expected), first
    # Within the gauges' lifetime (10 s) the database is not asked at all.
    await locker("inbound", "outbox", "escalations")
    for status, body in await asyncio.gather(*(get(url, timeout_s=3) for _ in range(5))):
        assert status == 200 and all(line in body.splitlines() for line in expected)


async def answers_to(emulator: SlackEmulator, user: str, n: int) -> list[str]:
    """What `user` alone was shown (ephemeral messages, then response_url answers), once it is `n` of them."""

    def shown() -> list[str]:
        ephemeral = [e.text for e in emulator.ephemerals if e.user == user]
        return ephemeral + [str(r.body.get("text")) for r in emulator.response_log if r.user == user]

    return await emulator.wait_for(lambda: (found := shown()) and len(found) >= n and found)


async def test_guests_and_external_members_are_never_staff(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.add_user("U_GUEST", "gus", "Gus Guest", guest="multi")
    emulator.add_user("U_GUEST1", "ginny", "Ginny Single-Channel", guest="single")
    emulator.add_user("U_EXT", "erin", "Erin Elsewhere", team_id="T_OTHER")
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    for outsider, why in (("U_GUEST", "guest"), ("U_GUEST1", "guest"), ("U_EXT", "outside this workspace")):
        await emulator.user_says(STAFF, f"{outsider} here: refund approved!", user=outsider, thread_ts=case.ts)
        [notice] = await answers_to(emulator, outsider, 1)
        assert notice.startswith("Only the support team can reply") and "not passed on" in notice and why in notice
        assert [e.thread_ts for e in emulator.ephemerals if e.user == outsider] == [case.ts]
        await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts, user=outsider)
        _, refused = await answers_to(emulator, outsider, 2)
        assert refused.startswith("Only the support team can claim") and why in refused
    await settle(sessions)
    assert relays_to_customer(emulator, thread) == []
    row = await escalation_row(sessions)
    assert (row.status, row.claimed_by, row.first_response_at) == ("open", None, None)
    # A full member of the workspace in the staff channel is staff (no allow-list is set).
    await emulator.user_says(STAFF, "Sam here, on it.", user="U_STAFF", thread_ts=case.ts)
    await emulator.wait_for(lambda: relays_to_customer(emulator, thread))
    await settle(sessions)
    assert (await escalation_row(sessions)).claimed_by == "U_STAFF"


@pytest.mark.parametrize("listed", ["ids", "usergroup"])
async def test_with_an_allow_list_only_the_people_on_it_are_staff(
    listed: str, database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.add_user("U_LEAD", "lee", "Lee Lead")
    emulator.add_usergroup("S_SUPPORT", ["U_LEAD"])
    allow = {"staff_user_ids": "U_LEAD, U_OTHER"} if listed == "ids" else {"staff_usergroup_id": "S_SUPPORT"}
    async with serving(bot_settings(database_url, fake_llm, emulator, **allow), emulator):
        thread, case = await escalate(emulator, fake_llm, sessions)
        row = await escalation_row(sessions)
        await emulator.user_says(STAFF, "I can take this", user="U_STAFF", thread_ts=case.ts)
        [notice] = await answers_to(emulator, "U_STAFF", 1)
        assert "not passed on" in notice and "not on the support team's list" in notice
        await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts, user="U_STAFF")
        _, refused = await answers_to(emulator, "U_STAFF", 2)
        assert refused.startswith("Only the support team can claim")
        await settle(sessions)
        assert relays_to_customer(emulator, thread) == [] and (await escalation_row(sessions)).status == "open"

        await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts, user="U_LEAD")
        await settle(sessions)
        assert (await escalation_row(sessions)).claimed_by == "U_LEAD"
        await emulator.user_says(STAFF, "Lee here, sorting it out.", user="U_LEAD", thread_ts=case.ts)
        assert await emulator.wait_for(lambda: relays_to_customer(emulator, thread)) == ["Lee here, sorting it out."]
        await settle(sessions)
    assert len(emulator.responses) == 1  # the lead's claim needed no answer


async def test_a_public_staff_channel_without_an_allow_list_is_warned_about(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions, caplog: Any
) -> None:
    emulator.add_channel(STAFF, "#staff", is_private=False)
    warned = lambda: [r for r in caplog.records if "IS PUBLIC" in r.getMessage()]  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="bot.slack.wiring"):
        async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
            await emulator.wait_for(warned)
        assert "THE STAFF CHANNEL #staff IS PUBLIC" in warned()[0].getMessage()
        caplog.clear()
        async with serving(bot_settings(database_url, fake_llm, emulator, staff_user_ids="U_STAFF"), emulator):
            pass
        assert not warned()  # with an allow-list, joining the channel makes nobody staff


async def test_a_replayed_slash_command_or_click_is_acted_on_once(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.add_user("U_ADMIN", "ada", "Ada Admin")
    async with serving(bot_settings(database_url, fake_llm, emulator, admin_user_ids="U_ADMIN"), emulator):
        assert (await emulator.slash_command("/support", "help", user="U_ADMIN")).status == 200
        command = emulator.deliveries[-1]
        await emulator.wait_for(lambda: emulator.responses)
        replayed = await emulator.redeliver(command)  # the same body, freshly signed: the same trigger_id
        assert (replayed.status, replayed.body) == (200, "")

        _, case = await escalate(emulator, fake_llm, sessions)
        row = await escalation_row(sessions)
        await emulator.click(ACTION_CLAIM, str(row.id), message_ts=case.ts)
        click = emulator.deliveries[-1]
        await settle(sessions)
        assert (await emulator.redeliver(click)).status == 200
        await asyncio.sleep(0.5)  # what a second run would have answered by now
        await settle(sessions)
    async with sessions() as s:
        assert (await s.scalars(select(m.AdminAction.command))).all() == ["help"]
    assert [r.source for r in emulator.response_log] == ["/support"]  # no second help, no "already claimed"
    assert (await escalation_row(sessions)).claimed_by == "U_STAFF"
