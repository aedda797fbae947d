"""The agent messaging experience beside the answers (issue 28): the operator's suggested prompts offered when a
customer opens their DM with the app, and a DM thread's title from the customer's first message in it. The bot runs
in this process against the Slack emulator over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Platform
from bot.channels.incoming import CustomerMessage
from bot.playground.slack_emulator import SlackEmulator, SuggestedPrompts
from bot.slack.agent_view import TITLE_CHARS, AgentView
from bot.slack.app import slack_client
from fakes.openai_server import FakeOpenAI, slow_words
from harness.bot import BOT_TOKEN, bot_settings, serving
from harness.database import settle

Sessions = async_sessionmaker[AsyncSession]
PROMPTS = (("Track a parcel", "Where is my parcel?"), ("Talk to a person", "I'd like to talk to a person."))
DECLARATION = """\
version: 1
brand: {name: Quillwork}
entry: desk
suggested_prompts:
  - title: Track a parcel
    message: Where is my parcel?
  - title: Talk to a person
    message: I'd like to talk to a person.
agents:
  desk:
    title: the desk
    description: Answers.
    instructions: You answer questions about Quillwork parcels.
"""


@pytest.fixture
def declared(tmp_path: Path) -> Path:
    path = tmp_path / "helpdesk.yaml"
    path.write_text(DECLARATION)
    return path


@pytest.fixture
async def view(emulator: SlackEmulator) -> AsyncIterator[AgentView]:
    emulator.add_channel("D_CASEY", "casey-dm", is_im=True)
    client = slack_client(token=BOT_TOKEN, base_url=emulator.api_url, idempotent_only=True)
    yield AgentView(client)


async def test_prompts_from_the_declaration_when_a_dm_is_opened(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, declared: Path
) -> None:
    emulator.add_channel("D_CASEY", "casey-dm", is_im=True)
    async with serving(bot_settings(database_url, fake_llm, emulator, helpdesk_file=declared), emulator):
        # agent_view, as both manifests ship: the Messages tab opened; the prompts go to the DM, naming no thread.
        opened = {"type": "app_home_opened", "user": "U_CUSTOMER", "channel": "D_CASEY", "tab": "messages"}
        assert (await emulator.deliver_event(opened | {"event_ts": "1.000001"})).status == 200
        await emulator.wait_for(lambda: len(emulator.suggested_prompts) == 1)
        # An app still on assistant_view hears assistant_thread_started, which names the thread Slack started.
        emulator.agent_view = False
        root = emulator.add_message("D_CASEY", "New chat")
        thread = {"user_id": "U_CUSTOMER", "channel_id": "D_CASEY", "thread_ts": root.ts, "context": {}}
        started = {"type": "assistant_thread_started", "assistant_thread": thread, "event_ts": "1.000002"}
        assert (await emulator.deliver_event(started)).status == 200
        await emulator.wait_for(lambda: len(emulator.suggested_prompts) == 2)
    assert emulator.suggested_prompts == [
        SuggestedPrompts("D_CASEY", None, None, PROMPTS, shown=True),
        SuggestedPrompts("D_CASEY", root.ts, None, PROMPTS, shown=True),
    ]


async def test_no_declared_prompts_leave_the_manifests_own(view: AgentView, emulator: SlackEmulator) -> None:
    view.opened("D_CASEY")
    await view.drain()
    assert emulator.calls_to("assistant.threads.setSuggestedPrompts") == []


def dm(text: str, *, ts: str, thread: str) -> CustomerMessage:
    return CustomerMessage("T0001", "D_CASEY", thread, ts, "U_CUSTOMER", text, True, "T0001", Platform.SLACK)


async def test_a_dm_thread_is_titled_once_from_its_first_message(view: AgentView, emulator: SlackEmulator) -> None:
    question = "<!channel> Where is my parcel?   It was due on Monday " + "and it is late " * 10
    root = emulator.add_message("D_CASEY", question)
    view.stored(dm(question, ts=root.ts, thread=root.ts))  # the thread's first message
    later = emulator.add_message("D_CASEY", "any news?", thread_ts=root.ts)
    view.stored(dm("any news?", ts=later.ts, thread=root.ts))  # a later one: the title stands
    await view.drain()
    assert len(emulator.calls_to("assistant.threads.setTitle")) == 1
    title = emulator.titles[("D_CASEY", root.ts)]
    assert title.startswith("&lt;!channel&gt; Where is my parcel? It was due on Monday")  # inert, one line
    assert len(title) <= TITLE_CHARS and title.endswith("…")


async def test_a_dm_is_a_thread_answered_streamed_and_titled_in_it(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """Through the bot: a customer's DM starts a conversation of its own thread, as the agent messaging experience
    shows it; the answer goes in that thread (streamed there, when it is long in the writing) and the thread is
    titled from the message."""
    emulator.add_channel("D_CASEY", "casey-dm", is_im=True)
    answer = " ".join(f"word{i}" for i in range(1, 21)) + "."
    fake_llm.script(slow_words(answer, first_s=0.1, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("D_CASEY", "Where is my parcel?")
        await settle(sessions, timeout_s=20)
    assert [p.text for p in emulator.posts("D_CASEY", said.ts)] == [answer]  # in the DM's thread
    [stream] = emulator.streams("D_CASEY")
    assert stream.texts[-1] == answer
    assert emulator.titles[("D_CASEY", said.ts)] == "Where is my parcel?"
