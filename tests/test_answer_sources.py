"""Answers carry the knowledge they were grounded in (issue 28): the sample knowledge base searched before the
agent's first call, the real engine and openai client against the fake model, a real Postgres, and the bot in this
process against the Teams and Slack emulators over HTTP. In Teams every agent's answer, streamed or posted, carries
the AI label, Teams' feedback control and its citations; a notice carries none. In Slack the sources are a line under
the answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.db.deliveries import Source
from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from bot.teams.citations import labelled
from bot.teams.text import from_markdown
from fakes.openai_server import FakeOpenAI, reply, slow_words, tool_call, tools
from fakes.teams_api import MESSAGE_ENTITY, Message, TeamsEmulator, message_entity_problem
from harness import teams as th
from harness.bot import bot_settings, serving
from harness.database import settle

Sessions = async_sessionmaker[AsyncSession]
QUESTION = "how long is the standard warranty period?"
ANSWER = "The standard warranty on every Driftwing drone is 12 months from delivery [1]."
TO_SUPPORT = tools(tool_call("transfer_to_support", {"reason": "a warranty question"}))
WARRANTY = "Warranty and Driftwing Care"
"""The title of the sample document the question is answered from (support/warranty.md)."""


@pytest.fixture
async def bot(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Bot]:
    # The triage agent hands over to support, whose knowledge is searched before its first call; no notice of the
    # handoff (a post of its own, which would finish the stream). The bar is the one the fake embeddings clear.
    settings = bot_settings(
        database_url, fake_llm, emulator, handoff_notice="", kb_min_similarity=0.3, **th.teams_settings(teams)
    )
    async with serving(settings, emulator) as running:
        teams.messaging_url = f"{running.url}/api/messages"
        yield running


def root_entity(post: Message) -> dict[str, Any] | None:
    roots = [e for e in post.activity.get("entities") or [] if e.get("type") == MESSAGE_ENTITY]
    assert len(roots) <= 1
    return roots[0] if roots else None


def assert_a_cited_ai_answer(post: Message) -> list[dict[str, Any]]:
    """The post is labelled AI-made, has Teams' feedback control, and cites the warranty document at [1]."""
    entity = root_entity(post)
    assert entity is not None and entity["additionalType"] == ["AIGeneratedContent"]
    assert post.activity["channelData"]["feedbackLoopEnabled"] is True
    citations: list[dict[str, Any]] = entity["citation"]
    positions = [c["position"] for c in citations]
    assert positions == list(range(1, len(citations) + 1))
    assert all(f"[{n}]" in post.text for n in positions), "every citation has its marker in the text"
    first = citations[0]["appearance"]
    assert first["name"].startswith(WARRANTY) and first["abstract"]
    assert "12 months" in post.text
    return citations


async def posted(teams: TeamsEmulator, conversation: str, root: str | None = None) -> list[Message]:
    return await teams.wait_for(lambda: teams.posts(conversation, root) or None, timeout=20)


async def test_a_streamed_teams_answer_cites_its_source_with_the_ai_label_and_feedback(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(TO_SUPPORT, slow_words(ANSWER, 0.2, 0.1))
    sent = await th.personal(teams, QUESTION)
    [post] = await posted(teams, sent.conversation_id)
    await settle(sessions)
    assert teams.shown_in(sent.conversation_id), "it streamed"
    assert post.id == teams.shown_in(sent.conversation_id)[0].stream_id
    citations = assert_a_cited_ai_answer(post)
    async with sessions() as s:
        [stored] = (await s.execute(select(m.Outbox.sources).where(m.Outbox.result_ts == post.id))).scalars()
    assert stored is not None and [source["title"] for source in stored][: len(citations)] == [
        c["appearance"]["name"].split(" › ")[0] for c in citations
    ]
    assert any(source["link"] == "support/warranty.md" for source in stored)


@pytest.mark.parametrize("where", ["channel", "group chat"])
async def test_a_posted_teams_answer_is_marked_the_same_and_its_rating_recorded(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions, where: str
) -> None:
    fake_llm.script(TO_SUPPORT, reply(ANSWER))
    if where == "channel":
        sent = await th.channel_post(teams, "support", QUESTION)
        conversation, root = th.channel(teams, "support"), sent.id
    else:
        sent = await th.group_chat(teams, "19:orders@thread.v2", QUESTION)
        conversation, root = sent.conversation_id, None
    [post] = await posted(teams, conversation, root)
    await settle(sessions)
    assert not teams.shown_in(conversation), "posted, not streamed"
    assert_a_cited_ai_answer(post)
    assert (await th.feedback(teams, post, "dislike")).status == 200
    deadline = time.monotonic() + 10
    while True:
        async with sessions() as s:
            rated = [(r.rating, r.message_ts) for r in (await s.execute(select(m.AnswerFeedback))).scalars()]
        if rated or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert rated == [("bad", post.id)]


async def test_a_notice_carries_no_label_citation_or_feedback(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    sent = await th.personal(teams, f"{QUESTION} I want to talk to a person")
    [notice] = await posted(teams, sent.conversation_id)
    await settle(sessions)
    assert "colleague" in notice.text
    assert root_entity(notice) is None and "feedbackLoopEnabled" not in (notice.activity.get("channelData") or {})
    async with sessions() as s:
        assert (await s.execute(select(m.Outbox.sources).where(m.Outbox.result_ts == notice.id))).scalar() is None


async def test_an_answer_without_sources_is_still_labelled_and_rated(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply("Hello! How can I help?"))
    sent = await th.personal(teams, "hi")
    [post] = await posted(teams, sent.conversation_id)
    entity = root_entity(post)
    assert entity is not None and entity["additionalType"] == ["AIGeneratedContent"] and "citation" not in entity
    assert post.activity["channelData"]["feedbackLoopEnabled"] is True and post.text == "Hello! How can I help?"


async def test_a_slack_answer_shows_its_sources_under_it(
    bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(TO_SUPPORT, reply(ANSWER))
    said = await emulator.user_says("C_SUPPORT", QUESTION)
    await settle(sessions)
    [answer] = emulator.posts("C_SUPPORT", said.ts)
    kinds = [b["type"] for b in answer.blocks or []]
    assert kinds == ["markdown", "context", "context_actions"]
    line = answer.blocks[1]["elements"][0]["text"]  # type: ignore[index]
    assert line.startswith(f"Sources: {WARRANTY} › ")


def test_the_emulator_refuses_what_teams_refuses_and_the_bot_sends_what_it_takes() -> None:
    def dumped(entity: Any) -> dict[str, Any]:
        return dict(entity.model_dump(mode="json", by_alias=True, exclude_unset=True))

    one = Source("Warranty", "Proof of purchase", "support/warranty.md", "Keep the receipt.")
    cited = dumped(labelled("text", [one])[1])
    assert message_entity_problem([cited]) is None
    claim = cited["citation"][0]
    assert "more than 20" in str(message_entity_problem([cited | {"citation": [claim] * 21}]))
    assert "Multiple root" in str(message_entity_problem([cited, cited]))
    empty = claim | {"appearance": {}}
    assert "appearance object is empty" in str(message_entity_problem([cited | {"citation": [empty]}]))
    long_name = claim | {"appearance": claim["appearance"] | {"name": "x" * 81}}
    assert "name" in str(message_entity_problem([cited | {"citation": [long_name]}]))

    # What the bot sends fits: at most 20 citations, names and abstracts clipped to Teams' lengths; the model's own
    # markers kept, those it did not write added at the end, and no marker made into a link.
    many = [Source("T" * 200, "H" * 50, f"https://kb.example/{n}", "w " * 200) for n in range(30)]
    text, label = labelled(from_markdown("See [1], and [3](https://evil.example)."), many)
    sent = dumped(label)
    assert message_entity_problem([sent]) is None and len(sent["citation"]) == 20
    assert text.startswith("See [1], and") and "[3](" not in text
    assert text.endswith(" ".join(f"[{n}]" for n in range(2, 21)))
