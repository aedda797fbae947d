"""Microsoft Teams over HTTP: activities signed by the Teams emulator's keys into the real bot (validated by the
Agents SDK's own code, through the emulator's sign-in hosts), the bot's Bot Connector calls back to the emulator with
the SDK's client credentials, the fake LLM behind the engine, a real Postgres under all of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from escalation.views import ACTION_CLAIM, ACTION_HAND_BACK
from fakes.openai_server import FakeOpenAI, reply, slow, tool_call, tools
from fakes.teams_api import Message, Op, TeamsEmulator
from fakes.teams_identity import TokenKind
from harness import teams as th
from harness.bot import BotProcess, bot_env, bot_process, bot_settings, serving
from harness.database import case_known, count, settle
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
ADMIN_AAD = "0b7a3c52-5f6e-4c1d-9e8f-112233445566"


def settings_for(database_url: str, llm: FakeOpenAI, slack: SlackEmulator, teams: TeamsEmulator, **more: Any) -> Any:
    """Slack and Teams in one process; staff in Slack's C_STAFF unless `more` says otherwise."""
    return bot_settings(database_url, llm, slack, **th.teams_settings(teams), **more)


@pytest.fixture
async def both(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Bot]:
    async with serving(settings_for(database_url, fake_llm, emulator, teams), emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        yield bot


@pytest.fixture
async def teams_staff(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Bot]:
    """Staff work in the Teams channel "Staff"; customers may write in either platform."""
    staff = teams.channel_id("staff")
    settings = settings_for(
        database_url, fake_llm, emulator, teams, staff_channel_id=None, teams_staff_channel_id=staff
    )
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        yield bot


async def bot_posts(teams: TeamsEmulator, conversation: str, n: int, root: str | None = None) -> list[Message]:
    return await teams.wait_for(lambda: (p := teams.posts(conversation, root)) and len(p) >= n and p, timeout=15)


async def test_a_personal_chat_message_is_answered(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(0.3, reply("Hi! I'm the **Driftwing** front desk.")))
    sent = await th.personal(teams, "hello there")
    assert sent.status == 200
    [answer] = await bot_posts(teams, sent.conversation_id, 1)
    assert answer.text == "Hi! I'm the **Driftwing** front desk."
    assert answer.activity.get("textFormat") == "markdown"
    assert teams.typing_in(sent.conversation_id), "the customer saw the bot typing while it worked"
    assert fake_llm.requests[0].last_user == "hello there"
    await settle(sessions)
    async with sessions() as s:
        [conversation] = (await s.execute(select(m.Conversation))).scalars().all()
        author = await s.scalar(select(m.Inbound.identity))
    assert conversation.key.startswith("teams:")
    assert author is not None and author["name"] == "Casey Customer" and author["email"] == "casey@driftwing.test"


async def test_a_channel_mention_is_answered_in_its_reply_chain_and_follow_ups_keep_the_agent(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply("Which budget do you have?"))
    post = await th.channel_post(teams, "support", "I want a camera drone")
    channel = th.channel(teams, "support")
    texts = [p.text for p in await bot_posts(teams, channel, 2, root=post.id)]
    assert texts == ["_Connecting you with Sales…_", "Which budget do you have?"]  # the handoff, in the same turn
    fake_llm.script(reply("Then the Kestrel Mini 2."))
    await th.channel_reply(teams, "support", post.id, "about $400")  # no mention: the chain continues
    texts = [p.text for p in await bot_posts(teams, channel, 3, root=post.id)]
    assert texts[-1].startswith("Then the Kestrel Mini 2.")  # then the citations of the catalogue it was given
    assert "You are Sales" in fake_llm.requests[-1].system
    assert [m["content"] for m in fake_llm.requests[-1].messages if m["role"] == "user"] == [
        "I want a camera drone",
        "about $400",
    ]


async def test_channel_traffic_that_is_not_for_the_bot_is_left_alone(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    post = await th.channel_post(teams, "support", "lunch, anyone?", mention_bot=False)
    stray = await th.channel_reply(teams, "support", post.id, "yes please")
    assert post.status == stray.status == 200
    await settle(sessions)
    assert await count(sessions, m.Inbound) == 0 and not fake_llm.requests


async def test_a_redelivered_activity_is_answered_once(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply("Once."))
    sent = await th.personal(teams, "are you there?")
    again = await th.redeliver(teams, sent)
    assert again.status == 200
    await bot_posts(teams, sent.conversation_id, 1)
    await settle(sessions)
    await asyncio.sleep(0.3)
    assert [p.text for p in teams.posts(sent.conversation_id)] == ["Once."]
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize(
    "token", [TokenKind.NONE, TokenKind.FORGED, TokenKind.EXPIRED, TokenKind.WRONG_AUDIENCE, TokenKind.UNKNOWN_KID]
)
async def test_activities_without_a_valid_token_are_refused_and_change_nothing(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions, token: TokenKind
) -> None:
    sent = await th.personal(teams, "let me in", token=token)
    assert sent.status == 401
    await settle(sessions)
    assert await count(sessions, m.Inbound) == 0 and await count(sessions, m.Received) == 0
    assert not fake_llm.requests and not teams.posts(sent.conversation_id)


async def test_a_token_for_another_service_url_is_refused(both: Bot, teams: TeamsEmulator, sessions: Sessions) -> None:
    """Answering would send the bot's own credentials to the activity's serviceUrl: it must be the token's."""
    built = await th.personal(teams, "send your token here", send=False)
    built.activity["serviceUrl"] = "http://127.0.0.1:9/steal/"
    sent = await th.deliver(teams, built)
    assert sent.status == 401
    await settle(sessions)
    assert await count(sessions, m.Inbound) == 0


async def test_a_teams_429_on_a_reply_is_waited_out_and_posted_once(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply("After the wait."))
    teams.fail_next(Op.SEND, status=429, retry_after=1, type="message")
    sent = await th.personal(teams, "hi")
    [answer] = await bot_posts(teams, sent.conversation_id, 1)
    assert answer.text == "After the wait."
    refused = [c for c in teams.calls if c.op == Op.SEND and c.failed]
    assert len(refused) == 1 and refused[0].status == 429
    await settle(sessions)
    await asyncio.sleep(0.5)
    assert [p.text for p in teams.posts(sent.conversation_id)] == ["After the wait."]


async def test_a_reply_whose_outcome_is_unknown_is_not_posted_twice_and_is_shown(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator, sessions: Sessions
) -> None:
    """Teams took the reply but its answer was lost: the Bot Connector API cannot say whether it is there, so
    it is never posted again; it is counted as given up (metrics, /support status), and the Teams admins are told
    in their chat with the bot."""
    teams.add_user("29:ada", "Ada Admin", aad_object_id=ADMIN_AAD)
    settings = settings_for(database_url, fake_llm, emulator, teams, teams_admin_ids=ADMIN_AAD)
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        fake_llm.script(reply("Exactly once, or at most once."))
        teams.drop_next(Op.SEND, type="message")
        sent = await th.personal(teams, "hi")
        await bot_posts(teams, sent.conversation_id, 1)
        await _until_given_up(sessions)
        assert [p.text for p in teams.posts(sent.conversation_id)] == ["Exactly once, or at most once."]
        assert len([c for c in teams.calls if c.op == Op.SEND and "Exactly" in str(c.body)]) == 1
        [alert] = await bot_posts(teams, teams.personal_chat("29:ada").id, 1)
        assert "may not have reached" in alert.text


async def _until_given_up(sessions: Sessions, n: int = 1) -> None:
    for _ in range(300):
        async with sessions() as s:
            if (await s.scalar(text("SELECT count(*) FROM outbox WHERE outcome = 'given_up'")) or 0) >= n:
                return
        await asyncio.sleep(0.05)
    async with sessions() as s:
        rows = (
            await s.execute(
                text("SELECT id, kind, attempts, attempted_at, outcome, last_error, next_attempt_at FROM outbox")
            )
        ).all()
    raise AssertionError(f"nothing was given up: {rows}")


async def escalate_in_teams(teams: TeamsEmulator, fake: FakeOpenAI) -> tuple[th.Sent, Message]:
    fake.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    sent = await th.personal(teams, "I want a person")
    staff = teams.channel_id("staff")
    card = await teams.wait_for(lambda: [p for p in teams.posts(staff) if p.root == p.id and p.cards], timeout=15)
    return sent, card[0]


async def test_staff_in_teams_take_a_teams_customers_case(
    teams_staff: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    sent, card = await escalate_in_teams(teams, fake_llm)
    customer = sent.conversation_id
    assert "I want a person" in str(card.cards[0])
    buttons = {a["data"]["helpdesk_action"] for a in card.cards[0]["actions"]}
    assert {ACTION_CLAIM, ACTION_HAND_BACK} <= buttons
    # A colleague answers in the card's reply chain: the customer gets it, under the colleague's name.
    await th.channel_reply(teams, "staff", card.id, "Hi, Sam here. Let me look.", user=th.STAFF)
    relayed = await bot_posts(teams, customer, 2)
    assert relayed[-1].text.endswith("Hi, Sam here. Let me look.") and "Sam Staff" in relayed[-1].text
    # A note stays internal.
    await th.channel_reply(teams, "staff", card.id, "note: refund pending", user=th.STAFF)
    # The customer's follow-up reaches the case.
    await th.personal(teams, "thanks, waiting")
    staff = teams.channel_id("staff")
    chain = await teams.wait_for(
        lambda: [p for p in teams.posts(staff, card.id) if "thanks, waiting" in p.text], timeout=15
    )
    assert "Casey Customer" in chain[0].text
    assert not any("refund pending" in p.text for p in teams.posts(customer))
    # Hand back, from the card: the bot answers again.
    press = await th.card_action(
        teams, card, {"helpdesk_action": ACTION_HAND_BACK, "value": str(await _case(sessions))}
    )
    assert press.status == 200
    await teams.wait_for(lambda: teams.message(staff, card.id) is not None and teams.message(staff, card.id).updated)
    fake_llm.script(reply("Back with the bot."))
    await th.personal(teams, "one more question")
    await teams.wait_for(lambda: any(p.text == "Back with the bot." for p in teams.posts(customer)), timeout=15)
    assert [p.text for p in teams.posts(customer)] == [
        "I've asked a colleague to join. A person will reply here shortly.",
        "**Sam Staff (Driftwing team)**: Hi, Sam here. Let me look.",
        "You're back with our assistant; ask away. A colleague is one message away if needed.",
        "Back with the bot.",
    ]
    handed_back = teams.message(staff, card.id)
    assert handed_back is not None and "Handed back to the bot by Sam Staff" in str(handed_back.cards[0])


async def _case(sessions: Sessions) -> int:
    async with sessions() as s:
        return int(await s.scalar(text("SELECT max(id) FROM escalations")) or 0)


async def test_a_teams_colleagues_edits_and_deletions_follow_the_relay(
    teams_staff: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI
) -> None:
    sent, card = await escalate_in_teams(teams, fake_llm)
    customer = sent.conversation_id
    first = await th.channel_reply(teams, "staff", card.id, "Your order shipped Tuesday.", user=th.STAFF)
    second = await th.channel_reply(teams, "staff", card.id, "Wrong customer, sorry", user=th.STAFF)
    await bot_posts(teams, customer, 3)
    await th.edit(teams, first, "Your order shipped Wednesday.")
    await th.delete(teams, second)
    await teams.wait_for(
        lambda: (
            [p.text for p in teams.posts(customer) if not p.deleted][1:]
            == ["**Sam Staff (Driftwing team)**: Your order shipped Wednesday."]
        ),
        timeout=15,
    )


async def test_staff_in_teams_take_a_slack_customers_case(
    teams_staff: Bot, teams: TeamsEmulator, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Customers in Slack (Connect), staff in Teams: one escalation, relays both ways, notes kept, hand back."""
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    said = await emulator.user_says("C_SUPPORT", "I want a person")
    staff = teams.channel_id("staff")
    [card] = await teams.wait_for(lambda: [p for p in teams.posts(staff) if p.root == p.id and p.cards], timeout=15)
    await th.channel_reply(teams, "staff", card.id, "Sam here: *on it*.", user=th.STAFF)
    await th.channel_reply(teams, "staff", card.id, "note: check the refund", user=th.STAFF)
    replies = await replies_in(emulator, "C_SUPPORT", said.ts, 2, wait_s=15)
    assert replies[-1].endswith("on it*.") and "refund" not in " ".join(replies)
    await emulator.user_says("C_SUPPORT", "thank you!", thread_ts=said.ts)
    await teams.wait_for(lambda: [p for p in teams.posts(staff, card.id) if "thank you!" in p.text], timeout=15)
    press = await th.card_action(
        teams, card, {"helpdesk_action": ACTION_HAND_BACK, "value": str(await _case(sessions))}
    )
    assert press.status == 200
    fake_llm.script(reply("The bot again."))
    await emulator.user_says("C_SUPPORT", "one more thing", thread_ts=said.ts)
    await teams.wait_for(lambda: "The bot again." in emulator_texts(emulator, said.ts), timeout=15)


def emulator_texts(emulator: SlackEmulator, thread: str) -> list[str]:
    return [p.text for p in emulator.posts("C_SUPPORT", thread)]


async def test_staff_in_slack_take_a_teams_customers_case(
    both: Bot, teams: TeamsEmulator, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Customers in Teams, staff in Slack's C_STAFF."""
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    sent = await th.personal(teams, "I want a person")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts("C_STAFF") if not p.thread_ts])
    assert "Casey Customer" in case.text and "Where: Microsoft Teams" in case.text and "<#" not in case.text
    await case_known(sessions, case.ts)
    staff_said = await emulator.user_says("C_STAFF", "Hi, Sam here.", user="U_STAFF", thread_ts=case.ts)
    assert staff_said.result.status == 200
    await emulator.user_says("C_STAFF", "note: VIP", user="U_STAFF", thread_ts=case.ts)
    relayed = await bot_posts(teams, sent.conversation_id, 2)
    assert relayed[-1].text.endswith("Hi, Sam here.") and not any("VIP" in p.text for p in relayed)
    await th.personal(teams, "great, thanks")
    await emulator.wait_for(lambda: [p for p in emulator.posts("C_STAFF", case.ts) if "great, thanks" in p.text])
    await emulator.click(ACTION_HAND_BACK, str(await _case(sessions)), message_ts=case.ts)
    fake_llm.script(reply("Bot here again."))
    await th.personal(teams, "and another question")
    await teams.wait_for(lambda: any(p.text == "Bot here again." for p in teams.posts(sent.conversation_id)))


async def test_admins_use_support_commands_in_a_personal_chat_and_others_are_refused(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    teams.add_user("29:ada", "Ada Admin", aad_object_id=ADMIN_AAD)
    settings = settings_for(database_url, fake_llm, emulator, teams, teams_admin_ids=ADMIN_AAD)
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        asked = await th.personal(teams, "/support status", user="29:ada")
        [answer] = await bot_posts(teams, asked.conversation_id, 1)
        assert "Database" in str(answer.activity) or "database" in str(answer.activity)
        refused = await th.personal(teams, "/support status")  # Casey is no admin
        [no] = await bot_posts(teams, refused.conversation_id, 1)
        assert "admin" in str(no.activity).lower()
        await settle(sessions)
        async with sessions() as s:
            audit = (await s.execute(select(m.AdminAction.user_id, m.AdminAction.allowed))).all()
        assert sorted(audit) == sorted([(ADMIN_AAD, True), (th.user_aad(teams, th.CUSTOMER), False)])
        assert not fake_llm.requests  # a command is never a customer's message
        # From the app's command menu an admin's command comes bare; a customer's "help" is a question.
        bare = await th.personal(teams, "escalations", user="29:ada")
        assert "escalations" in str((await bot_posts(teams, bare.conversation_id, 2))[-1].activity).lower()
        fake_llm.script(reply("Happy to help!"))
        await th.personal(teams, "help")
        await teams.wait_for(lambda: any(p.text == "Happy to help!" for p in teams.posts(refused.conversation_id)))


@pytest.fixture
async def teams_process(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Callable[[], Awaitable[BotProcess]]]:
    """A factory of `python -m bot serve` processes serving Teams (and Slack); Teams delivers to the last one."""
    env = bot_env(database_url, fake_llm, emulator, lease_seconds=2, **th.teams_settings(teams)) | teams.env()
    async with AsyncExitStack() as started:

        async def start() -> BotProcess:
            process = await started.enter_async_context(bot_process(env, emulator))
            teams.messaging_url = f"{process.url}/api/messages"
            return process

        yield start


async def test_killed_mid_turn_and_restarted_the_customer_is_answered_once(
    teams_process: Callable[[], Awaitable[BotProcess]], teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(30, reply("never sent")), reply("Here I am, once."))
    first = await teams_process()
    sent = await th.personal(teams, "is anyone there?")
    assert sent.status == 200
    await teams.wait_for(lambda: fake_llm.calls == 1, timeout=15)  # mid-turn
    await first.kill()
    assert teams.posts(sent.conversation_id) == []
    second = await teams_process()
    await bot_posts(teams, sent.conversation_id, 1)
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert [p.text for p in teams.posts(sent.conversation_id)] == ["Here I am, once."]
    await second.kill()


async def test_killed_after_teams_took_the_reply_it_is_not_posted_again(
    teams_process: Callable[[], Awaitable[BotProcess]], teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """What the README promises for Teams after a crash: a reply Teams may have is never posted twice; it is
    given up (counted, in /support status) for a person to check."""
    fake_llm.script(slow(1.0, reply("Posted at most once.")))
    first = await teams_process()
    sent = await th.personal(teams, "hello")
    await teams.wait_for(lambda: teams.typing_in(sent.conversation_id), timeout=15)
    teams.hold(Op.SEND)  # the reply's post, not the typing indicator before it
    await teams.wait_for(lambda: [c for c in teams.calls if c.op == Op.SEND and "Posted" in str(c.body)], timeout=15)
    await first.kill()  # Teams has the reply; the bot dies before hearing so
    teams.release(Op.SEND)
    second = await teams_process()
    await _until_given_up(sessions)
    assert [p.text for p in teams.posts(sent.conversation_id)] == ["Posted at most once."]
    assert len([c for c in teams.calls if c.op == Op.SEND and "Posted" in str(c.body)]) == 1
    await second.kill()


async def test_a_group_chat_is_one_conversation_that_a_mention_starts(
    both: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    chat = "19:casey-and-friends@thread.v2"
    ignored = await th.group_chat(teams, chat, "shall we order pizza?", mention_bot=False)
    assert ignored.status == 200
    fake_llm.script(reply("The Kestrel Mini 2 is in stock."))
    await th.group_chat(teams, chat, "is the Kestrel Mini 2 in stock?")
    assert (await bot_posts(teams, chat, 1))[0].text == "The Kestrel Mini 2 is in stock."
    fake_llm.script(reply("Yes, it ships tomorrow."))
    await th.group_chat(teams, chat, "and does it ship soon?", mention_bot=False)
    assert (await bot_posts(teams, chat, 2))[-1].text == "Yes, it ships tomorrow."
    assert [m["content"] for m in fake_llm.requests[-1].messages if m["role"] == "user"] == [
        "is the Kestrel Mini 2 in stock?",
        "and does it ship soon?",
    ]


async def test_a_guest_in_the_teams_staff_channel_is_not_staff(
    teams_staff: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI
) -> None:
    teams.add_user("29:gus", "Gus Guest", role="guest")
    sent, card = await escalate_in_teams(teams, fake_llm)
    await th.channel_reply(teams, "staff", card.id, "I can help! Send me your card number.", user="29:gus")
    await th.channel_reply(teams, "staff", card.id, "Sam here, for real.", user=th.STAFF)
    relayed = await bot_posts(teams, sent.conversation_id, 2)
    await asyncio.sleep(0.5)
    texts = [p.text for p in teams.posts(sent.conversation_id)]
    assert relayed[-1].text.endswith("Sam here, for real.") and not any("card number" in t for t in texts)
    told = teams.personal_chat("29:gus").id
    assert any("guest" in p.text.lower() for p in await bot_posts(teams, told, 1))


async def test_an_entra_token_of_our_own_tenant_is_not_a_channels_word(
    both: Bot, teams: TeamsEmulator, sessions: Sessions
) -> None:
    """Any app registered in our tenant can get an Entra token for our app id; with it, an activity could name any
    sender and any serviceUrl. Only the Bot Framework's channel tokens are taken."""
    now = int(time.time())
    claims = {"aud": th.APP_ID, "iss": f"https://sts.windows.net/{th.TENANT_ID}/", "nbf": now - 60, "exp": now + 600}
    built = await th.personal(teams, "/support status", send=False)
    headers = {"Authorization": f"Bearer {teams.login.entra_key.sign(claims)}"}
    assert teams.messaging_url is not None
    async with (
        aiohttp.ClientSession() as http,
        http.post(teams.messaging_url, json=built.activity, headers=headers) as r,
    ):
        assert r.status == 401
    built = await th.personal(teams, "from web chat", send=False)
    built.activity["channelId"] = "webchat"
    assert (await th.deliver(teams, built)).status == 401
    await settle(sessions)
    assert await count(sessions, m.Inbound) == 0 and await count(sessions, m.AdminAction) == 0


async def test_a_bot_with_only_teams_configured_serves_teams(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    """No Slack at all: `/api/messages` is served, `/slack/events` is not, and cases go to the Teams channel."""
    staff = teams.channel_id("staff")
    settings = settings_for(
        database_url,
        fake_llm,
        emulator,
        teams,
        slack_bot_token=None,
        slack_signing_secret=None,
        staff_channel_id=None,
        teams_staff_channel_id=staff,
    )
    async with serving(settings, emulator) as bot:
        assert bot.app is None
        teams.messaging_url = f"{bot.url}/api/messages"
        async with aiohttp.ClientSession() as http, http.post(f"{bot.url}/slack/events", data="{}") as response:
            assert response.status == 404
        fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
        sent = await th.personal(teams, "a person please")
        await teams.wait_for(lambda: [p for p in teams.posts(staff) if p.cards], timeout=15)
        assert (await bot_posts(teams, sent.conversation_id, 1))[0].text.startswith("I've asked a colleague")
        assert not emulator.calls
