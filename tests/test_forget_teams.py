"""Forgetting a Teams customer, over HTTP: a conversation in their personal chat with the bot (an answer, an
escalation to the Teams staff channel, relays both ways) through the Teams emulator and the fake model, then
`helpdesk-bot forget --platform teams --user 29:…`: nothing of theirs is in any text or JSON column, and every
message the bot posted in their chat and in the case's reply chain is deleted through the Bot Connector API."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot import personal as cli
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from fakes.teams_api import Message, Op, TeamsEmulator
from harness import teams as th
from harness.bot import bot_settings, serving
from harness.database import held, settle

Sessions = async_sessionmaker[AsyncSession]
PHRASES = ("burnt marmalade", "ZEBRA-4411", "Casey Customer", "casey@driftwing.test")


def _theirs(teams: TeamsEmulator) -> tuple[str, ...]:
    """Their Teams id, their Entra object id, their name, email and words."""
    return (th.CUSTOMER, th.user_aad(teams, th.CUSTOMER), *PHRASES)


def _shown(posts: list[Message]) -> list[str]:
    return [p.text for p in posts if not p.deleted]


async def test_forgetting_a_teams_customer_leaves_nothing_in_the_tables_or_their_chat_or_the_staff_channel(
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    teams: TeamsEmulator,
    capsys: pytest.CaptureFixture[str],
) -> None:
    staff = teams.channel_id("staff")
    settings = bot_settings(
        database_url,
        fake_llm,
        emulator,
        **th.teams_settings(teams),
        staff_channel_id=None,
        teams_staff_channel_id=staff,
    )
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        fake_llm.script(reply("Sorry about the burnt marmalade smell; I see invoice ZEBRA-4411."))
        sent = await th.personal(teams, "my drone smells of burnt marmalade, invoice ZEBRA-4411")
        chat = sent.conversation_id
        await teams.wait_for(lambda: _shown(teams.posts(chat)), timeout=15)
        fake_llm.script(
            tools(tool_call("escalate_to_human", {"reason": "burnt marmalade smell: customer wants a person"}))
        )
        await th.personal(teams, "a person please, about the burnt marmalade")
        [card] = await teams.wait_for(lambda: [p for p in teams.posts(staff) if p.root == p.id and p.cards], timeout=15)
        await th.personal(teams, "the burnt marmalade is worse")
        await teams.wait_for(lambda: [p for p in teams.posts(staff, card.id) if "worse" in p.text], timeout=15)
        await th.channel_reply(
            teams, "staff", card.id, "Sorry about the burnt marmalade, Casey Customer", user=th.STAFF
        )
        await teams.wait_for(lambda: [p for p in teams.posts(chat) if "Sam Staff" in p.text], timeout=15)
        await settle(sessions)
        theirs = _theirs(teams)
        assert await held(sessions, theirs)  # the seed holds them
        assert len(_shown(teams.posts(chat))) >= 3 and len(_shown(teams.posts(staff, card.id))) >= 2

        # Teams deletes the first post but its answer is lost: the erase is tried again, and Teams' 404 for an
        # activity that is gone counts as done.
        teams.drop_next(Op.DELETE)
        # The operator's command, as `helpdesk-bot forget --platform teams --user 29:casey --yes` runs it.
        args = argparse.Namespace(command="forget", platform="teams", user=th.CUSTOMER, yes=True)
        assert await asyncio.to_thread(cli.run, settings, args) == 0
        assert "Forgotten" in capsys.readouterr().out

        # The running bot's outbox takes down what it posted, in their chat and in the staff channel.
        await teams.wait_for(lambda: not _shown(teams.posts(chat)) and not _shown(teams.posts(staff)), timeout=15)
        await settle(sessions)
        assert await held(sessions, theirs) == []
        async with sessions() as s:
            erased = await s.scalar(text("SELECT count(*) FROM outbox WHERE kind = 'erase' AND outcome = 'sent'"))
            owed = await s.scalar(text("SELECT count(*) FROM outbox WHERE done_at IS NULL"))
        assert erased and owed == 0
        deletes = [c for c in teams.calls if c.op == Op.DELETE]
        [lost] = [c for c in deletes if c.dropped]
        [gone] = [c for c in deletes if c.failed]
        assert (gone.status, gone.activity_id) == (404, lost.activity_id)
        done = [c.activity_id for c in deletes if not c.failed]
        assert len(done) == len(set(done)) == len([p for p in teams.posts(chat) + teams.posts(staff) if p.deleted])
        # Their chat starts afresh.
        fake_llm.script(reply("Hello again! How can I help?"))
        await th.personal(teams, "hello, it's me again")
        await teams.wait_for(lambda: _shown(teams.posts(chat)) == ["Hello again! How can I help?"], timeout=15)


async def test_a_teams_admin_forgets_the_person_they_mention(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    """In Teams a mention is `<at>Name</at>` in the text, the person's id only in a `mention` entity."""
    admin = teams.add_user("29:ada", "Ada Admin")
    settings = bot_settings(
        database_url, fake_llm, emulator, **th.teams_settings(teams), teams_admin_ids=admin.aad_object_id
    )
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        fake_llm.script(reply("Sorry about the burnt marmalade smell."))
        sent = await th.personal(teams, "my drone smells of burnt marmalade")
        await teams.wait_for(lambda: _shown(teams.posts(sent.conversation_id)), timeout=15)
        command = await th.personal(teams, "/support forget", user="29:ada", send=False)
        mention = "<at>Casey Customer</at>"
        command.activity["text"] = f"/support forget {mention}"
        command.activity["attachments"] = [{"contentType": "text/html", "content": f"<p>/support forget {mention}</p>"}]
        person = {"id": th.CUSTOMER, "name": "Casey Customer"}
        command.activity["entities"].append({"type": "mention", "text": mention, "mentioned": person})
        assert (await th.deliver(teams, command)).status == 200
        [answer] = await teams.wait_for(lambda: teams.posts(command.conversation_id), timeout=15)
        assert "Forgotten" in str(answer.activity)
        await teams.wait_for(lambda: not _shown(teams.posts(sent.conversation_id)), timeout=15)
        await settle(sessions)
        assert await held(sessions, _theirs(teams)) == []
