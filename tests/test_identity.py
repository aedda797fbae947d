"""Identity reaches the tools: each message is stored with its verified author, tools act for the author of the
message being answered (never for an id the model passes), and the model sees who wrote what in a shared thread.

The engine tests store messages with an `Author` as an edge would; the Slack tests go through the emulator, whose
users.info gives the name and email the inbox stores."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db import models as m
from agents.identity import Author
from bot.examples.driftwing.shop import ORDERS, REFUND_CONFIRMATION
from bot.playground.slack_emulator import TEAM_ID, SlackEmulator
from fakes.openai_server import FakeOpenAI, RecordedRequest, reply, tool_call, tools
from fakes.teams_api import TeamsEmulator
from harness import teams as th
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]

ADA_ORDER, BEN_ORDER = ORDERS["DW-1001"], ORDERS["DW-1002"]
ADA = Author("test", None, "U_ADA", "Ada Park", ADA_ORDER.customer.email)
BEN_SECRETS = ("Ben", "Ortiz", "Harrier", "1,299", "129900", "shipped", "2026-11-12")
"""What DW-1002 would reveal about its owner."""


def tool_outputs(request: RecordedRequest) -> list[str]:
    return [str(msg["content"]) for msg in request.messages if msg["role"] == "tool"]


def user_contents(request: RecordedRequest) -> list[str]:
    return [str(msg["content"]) for msg in request.messages if msg["role"] == "user"]


async def refunds(sessions: Sessions) -> list[m.Refund]:
    async with sessions() as s:
        return list((await s.scalars(select(m.Refund))).all())


async def test_another_customers_order_reveals_nothing_of_it(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("lookup_order", {"order_id": "DW-1002"}), tool_call("lookup_order", {"order_id": "DW-9999"})),
        reply("I can't find that order on your account."),
    )
    await service.handle("t:ada", "where is my order DW-1002?", author=ADA)
    theirs, missing = tool_outputs(fake_llm.requests[-1])[-2:]
    assert "I can't find that order on your account" in theirs
    assert not [secret for secret in BEN_SECRETS if secret in theirs]
    # Someone else's order reads exactly as one that does not exist: order numbers cannot be probed.
    assert theirs.replace("DW-1002", "DW-X") == missing.replace("DW-9999", "DW-X")

    # Her own order she sees.
    fake_llm.script(tools(tool_call("lookup_order", {"order_id": "dw-1001"})), reply("It was delivered."))
    await service.handle("t:ada", "and DW-1001?", author=ADA)
    assert "Order DW-1001 for Ada Park: Kestrel Mini 2 drone, $349.00" in tool_outputs(fake_llm.requests[-1])[-1]


async def test_a_refund_of_another_customers_order_is_refused(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("issue_refund", {"order_id": "DW-1002"})),
        reply("Shall I?"),
    )
    await service.handle("t:ada", "refund DW-1002", author=ADA)
    fake_llm.script(tools(tool_call("issue_refund", {"order_id": "DW-1002", "confirmed": True})), reply("Hmm."))
    await service.handle("t:ada", "yes", author=ADA)
    outputs = [*tool_outputs(fake_llm.requests[-3])[-1:], tool_outputs(fake_llm.requests[-1])[-1]]
    for output in outputs:
        assert "I can't find that order on your account" in output and "Nothing was refunded" in output
        assert not [secret for secret in BEN_SECRETS if secret in output]
    assert await refunds(sessions) == []
    # Without a verified author nobody's order is anybody's.
    fake_llm.script(tools(tool_call("lookup_order", {"order_id": "DW-1001"})), reply("Sorry."))
    await service.handle("t:ada", "DW-1001 then", author=None)
    assert "no verified email" in tool_outputs(fake_llm.requests[-1])[-1]


async def test_a_late_yes_does_not_confirm_a_refund(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    confirm = tool_call("issue_refund", {"order_id": "DW-1001", "confirmed": True})
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("issue_refund", {"order_id": "DW-1001"})),
        reply("Shall I refund $349.00 for DW-1001?"),
    )
    await service.handle("t:ada", "refund DW-1001 please", author=ADA)
    # The customer answers after the question expired.
    async with sessions() as s, s.begin():
        await s.execute(
            text(
                "UPDATE conversations SET context = jsonb_set(context, '{pending_refund,asked_at}', "
                "to_jsonb(CAST(now() - make_interval(secs => :late) AS text)))"
            ),
            {"late": REFUND_CONFIRMATION.total_seconds() + 60},
        )
    fake_llm.script(tools(confirm), reply("That question expired; shall I refund it?"))
    await service.handle("t:ada", "yes", author=ADA)
    late = tool_outputs(fake_llm.requests[-1])[-1]
    assert "expired" in late and "Not refunded yet. Ask the customer" in late
    assert await refunds(sessions) == []
    # Asked again, a yes in time counts.
    fake_llm.script(tools(confirm), reply("Done."))
    await service.handle("t:ada", "yes, go ahead", author=ADA)
    assert tool_outputs(fake_llm.requests[-1])[-1].startswith("Refunded $349.00 for order DW-1001")
    assert [r.order_id for r in await refunds(sessions)] == ["DW-1001"]


# --- Slack: two people in one thread --------------------------------------------------------------------------


def _two_customers(emulator: SlackEmulator) -> None:
    emulator.add_user("U_ADA", "ada", "Ada Park", email=ADA_ORDER.customer.email)
    emulator.add_user("U_BEN", "ben", "Ben Ortiz", email=BEN_ORDER.customer.email)


async def test_in_a_shared_thread_only_the_asker_confirms_a_refund(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    _two_customers(emulator)
    confirm = tool_call("issue_refund", {"order_id": "DW-1001", "confirmed": True})
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("issue_refund", {"order_id": "DW-1001"})),
        reply("Shall I refund $349.00 for order DW-1001?"),
    )
    asked = await emulator.user_says("C_SUPPORT", "Please refund my order DW-1001", user="U_ADA")
    await replies_in(emulator, "C_SUPPORT", asked.ts, 2)

    fake_llm.script(tools(confirm), reply("Only Ada can confirm that."))
    await emulator.user_says("C_SUPPORT", "yes", user="U_BEN", thread_ts=asked.ts)
    await replies_in(emulator, "C_SUPPORT", asked.ts, 3)
    refused = tool_outputs(fake_llm.requests[-1])[-1]
    assert refused.startswith("Not refunded: Ada Park asked for this refund and only they can confirm it")
    assert await refunds(sessions) == []

    fake_llm.script(tools(confirm), reply("Done, refunded."))
    await emulator.user_says("C_SUPPORT", "yes please", user="U_ADA", thread_ts=asked.ts)
    assert (await replies_in(emulator, "C_SUPPORT", asked.ts, 4))[-1] == "Done, refunded."
    assert tool_outputs(fake_llm.requests[-1])[-1].startswith("Refunded $349.00 for order DW-1001")
    assert [r.order_id for r in await refunds(sessions)] == ["DW-1001"]


async def test_the_model_sees_who_wrote_each_message_in_a_shared_thread(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    _two_customers(emulator)
    fake_llm.script(reply("Hello Ada!"))
    first = await emulator.user_says("C_SUPPORT", "Hi, it's Ada", user="U_ADA")
    await replies_in(emulator, "C_SUPPORT", first.ts, 1)
    # One person so far: the prompt is as it always was.
    assert user_contents(fake_llm.requests[-1]) == ["Hi, it's Ada"]

    fake_llm.script(reply("Hello Ben!"))
    await emulator.user_says("C_SUPPORT", "Ben here, same team", user="U_BEN", thread_ts=first.ts)
    await replies_in(emulator, "C_SUPPORT", first.ts, 2)
    fake_llm.script(reply("Sure."))
    await emulator.user_says("C_SUPPORT", "Can you check my order?", user="U_ADA", thread_ts=first.ts)
    await replies_in(emulator, "C_SUPPORT", first.ts, 3)
    assert user_contents(fake_llm.requests[-1]) == [
        "[Ada Park]: Hi, it's Ada",
        "[Ben Ortiz]: Ben here, same team",
        "[Ada Park]: Can you check my order?",
    ]
    await settle(sessions)
    async with sessions() as s:
        identities = list((await s.scalars(select(m.Inbound.identity).order_by(m.Inbound.id))).all())
    assert identities[1] == {
        "platform": "slack",
        "workspace": TEAM_ID,
        "user": "U_BEN",
        "name": "Ben Ortiz",
        "email": BEN_ORDER.customer.email,
        "locale": "en-US",  # the emulator's users.info, asked with include_locale
    }


async def test_a_slow_profile_does_not_hold_the_ack(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.hold("users.info")
    fake_llm.script(reply("Hello!"))
    started = time.monotonic()
    said = await emulator.user_says("C_SUPPORT", "hello?")
    assert said.result.status == 200 and time.monotonic() - started < 3.0  # Slack's deadline for the ack
    await replies_in(emulator, "C_SUPPORT", said.ts, 1)
    emulator.release("users.info")
    # Stored with what the signed event says; without an email, no order is this writer's.
    async with sessions() as s:
        identity = await s.scalar(select(m.Inbound.identity))
    assert identity == {
        "platform": "slack",
        "workspace": TEAM_ID,
        "user": "U_CUSTOMER",
        "name": None,
        "email": None,
        "locale": None,
    }


# --- Whose email counts: our organisation's, or a listed customer organisation's ---------------------------------

OTHER_ORG = "5d1c7a9e-0f3b-4e2a-8c6d-9b8a7f6e5d4c"
"""Another company's Teams tenant; as a Slack team id, another company's workspace."""
NOT_YOURS = "no verified email"
"""What the sample shop's lookup_order says when the asker has no email it may trust."""


def _order_lookup(fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("lookup_order", {"order_id": "DW-1001"})),
        reply("Here is what I found."),
    )


def assert_order_shown(output: str, listed: bool) -> None:
    """Ada's order in the look-up's result when the writer's organisation is listed; else what a stranger gets."""
    if listed:
        assert "Order DW-1001 for Ada Park" in output
    else:
        assert NOT_YOURS in output and "Ada" not in output


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed"])
async def test_a_teams_member_of_another_tenant_gets_an_order_only_when_their_tenant_is_listed(
    listed: bool,
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    teams: TeamsEmulator,
) -> None:
    """Another tenant's admins set their members' emails: one set to Ada's opens Ada's order only if the operator
    lists that tenant among the customer organisations."""
    teams.add_user("29:mallory", "Mallory Stone", email=ADA_ORDER.customer.email, tenant=OTHER_ORG)
    more = {"customer_organisations": OTHER_ORG} if listed else {}
    async with serving(
        bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams), **more), emulator
    ) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        _order_lookup(fake_llm)
        sent = await th.personal(teams, "where is my order DW-1001?", user="29:mallory")
        assert sent.status == 200
        await teams.wait_for(lambda: teams.posts(sent.conversation_id), timeout=15)
    output = tool_outputs(fake_llm.requests[-1])[-1]
    assert_order_shown(output, listed)
    async with sessions() as s:
        identity = await s.scalar(select(m.Inbound.identity))
    # Tools (and an operator's MCP and HTTP tools) know them by their tenant and Teams id either way.
    assert identity is not None and identity["workspace"] == OTHER_ORG and identity["user"] == "29:mallory"
    assert identity["email"] == (ADA_ORDER.customer.email if listed else None)


async def test_a_teams_member_of_our_tenant_gets_their_order(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    teams.add_user("29:ada", "Ada Park", email=ADA_ORDER.customer.email)
    async with serving(bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams)), emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        _order_lookup(fake_llm)
        sent = await th.personal(teams, "where is my order DW-1001?", user="29:ada")
        await teams.wait_for(lambda: teams.posts(sent.conversation_id), timeout=15)
    assert "Order DW-1001 for Ada Park" in tool_outputs(fake_llm.requests[-1])[-1]


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed"])
async def test_a_slack_connect_user_gets_an_order_only_when_their_workspace_is_listed(
    listed: bool, database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """A Slack Connect user's profile email is their own organisation's to set (and to confirm)."""
    emulator.add_user("U_MAL", "mallory", "Mallory Stone", email=ADA_ORDER.customer.email, team_id="T_OTHER")
    more = {"customer_organisations": "T_OTHER"} if listed else {}
    async with serving(bot_settings(database_url, fake_llm, emulator, **more), emulator):
        _order_lookup(fake_llm)
        said = await emulator.user_says("C_SUPPORT", "where is my order DW-1001?", user="U_MAL")
        await replies_in(emulator, "C_SUPPORT", said.ts, 2)
    output = tool_outputs(fake_llm.requests[-1])[-1]
    assert_order_shown(output, listed)
    async with sessions() as s:
        identity = await s.scalar(select(m.Inbound.identity))
    assert identity is not None and (identity["workspace"], identity["user"]) == ("T_OTHER", "U_MAL")


async def test_an_unconfirmed_slack_email_opens_no_order(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    """In our own workspace too, an email counts once Slack says its owner confirmed it."""
    emulator.add_user("U_ADA", "ada", "Ada Park", email=ADA_ORDER.customer.email, email_confirmed=False)
    _order_lookup(fake_llm)
    said = await emulator.user_says("C_SUPPORT", "where is my order DW-1001?", user="U_ADA")
    await replies_in(emulator, "C_SUPPORT", said.ts, 2)
    assert NOT_YOURS in tool_outputs(fake_llm.requests[-1])[-1]
