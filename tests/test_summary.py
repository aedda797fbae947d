"""Bounded history: older turns folded into a running summary (agents.summary), end to end on a real Postgres with
the real openai SDK over HTTP to the fake."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db import models as m
from agents.db.engine import make_engine, make_sessions
from agents.summary import AGENT, PROMPT, Summarising
from agents.window import EARLIER
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, error, reply, tool_call, tools
from harness.llm import CONFIG, make_model
from harness.sample import default_roster

Sessions = async_sessionmaker[AsyncSession]

SUMMARISING = Summarising(model="summary-model", high_water=600)
"""Low marks, so that a few messages make a summary due."""
PADDING = "The gimbal drifts to the left and the horizon tilts in every clip I record, even in calm weather. " * 3


def engine_of(sessions: Sessions, model: Any) -> Conversations:
    return Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG,
        summarising=SUMMARISING,
    )  # fmt: skip


def summarised(request: RecordedRequest) -> str:
    """A summary's answer: what it was asked to fold, in short, so that tests see what went in."""
    return f"Summary {request.last_user.count('Customer')} turns; Casey, order DW-1004."


def answers(request: RecordedRequest) -> FakeReply:
    if request.system == PROMPT:
        return reply(summarised(request))
    return reply("Thanks, I have noted that. " + PADDING)


def with_tools(request: RecordedRequest) -> FakeReply:
    """Every turn calls a tool, then answers: pairs of calls and results all along the history."""
    if request.system == PROMPT:
        return reply(summarised(request))
    if request.messages[-1]["role"] == "user":
        return tools(
            tool_call("record_customer_name", {"name": "Casey"}), tool_call("record_customer_name", {"name": "C"})
        )
    return reply("Noted. " + PADDING)


def system_texts(request: RecordedRequest) -> list[str]:
    return [str(msg["content"]) for msg in request.messages if msg["role"] == "system"]


async def conversation_row(sessions: Sessions, key: str) -> m.Conversation:
    async with sessions() as s:
        row = await s.scalar(select(m.Conversation).where(m.Conversation.key == key))
        assert row is not None
        return row


async def settle(service: Conversations) -> None:
    """Wait for the summary a turn started after its commit (the reply does not)."""
    assert service.summaries is not None
    await service.summaries.settled()


async def talk(service: Conversations, key: str, count: int) -> None:
    for i in range(count):
        result = await service.handle(key, f"Message {i}: {PADDING}")
        assert result.kind == "reply"
        assert service.summaries is not None
        await settle(service)


async def test_long_conversation_gets_a_summary_and_the_next_request_carries_it(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    fake_llm.rule = answers
    service = engine_of(sessions, model)
    await talk(service, "t:long", 12)

    row = await conversation_row(sessions, "t:long")
    assert row.summary is not None and row.summary.startswith("Summary") and row.summary_through is not None
    async with sessions() as s:
        stored = int(await s.scalar(select(func.count()).select_from(m.Message)) or 0)
        calls = list(await s.scalars(select(m.LLMCall).where(m.LLMCall.agent == AGENT)))
    assert stored == 24  # the transcript keeps everything
    # Rare: one summary every several messages, each recorded like any call, with its own model.
    assert 1 <= len(calls) <= 12 // 3
    assert all(c.ok and c.model == "summary-model" and c.prompt_tokens > 0 for c in calls)
    summary_requests = [r for r in fake_llm.requests if r.system == PROMPT]
    assert len(summary_requests) == len(calls) and summary_requests[0].tools == []
    assert "Message 0:" in summary_requests[0].last_user
    assert "Previous summary:" in summary_requests[-1].last_user

    fake_llm.requests.clear()
    await service.handle("t:long", "And what now?")
    await settle(service)
    [request] = [r for r in fake_llm.requests if r.system != PROMPT]
    # Instructions first (the cacheable prefix), then the summary as one system message, then the recent turns.
    systems = system_texts(request)
    assert "front desk" in systems[0] and systems[-1] == EARLIER + row.summary
    assert request.messages[len(systems) - 1]["content"] == EARLIER + row.summary
    history = [msg for msg in request.messages if msg["role"] != "system"]
    assert len(history) < stored
    assert history[0]["role"] == "user" and "Message 0:" not in str(history[0]["content"])
    # Under the high-water mark, about: the prompt no longer grows with the conversation.
    assert sum(len(str(msg["content"])) for msg in history) // 4 < 2 * SUMMARISING.high_water


async def test_tool_calls_stay_paired_with_their_results(sessions: Sessions, model: Any, fake_llm: FakeOpenAI) -> None:
    fake_llm.rule = with_tools
    service = engine_of(sessions, model)
    await talk(service, "t:tools", 10)
    assert (await conversation_row(sessions, "t:tools")).summary is not None
    for request in fake_llm.requests:
        called: set[str] = set()
        answered: set[str] = set()
        for msg in request.messages:
            if msg["role"] == "assistant":
                called.update(c["id"] for c in msg.get("tool_calls") or ())
            if msg["role"] == "tool":
                assert msg["tool_call_id"] in called, "a tool result without its call"
                answered.add(msg["tool_call_id"])
        assert called <= answered, "a tool call without its result"
        if request.system != PROMPT:
            first = next(msg for msg in request.messages if msg["role"] != "system")
            assert first["role"] == "user"


async def test_a_failing_summary_call_does_not_fail_the_turn(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    def failing(request: RecordedRequest) -> FakeReply:
        return error(500, "summary model down") if request.system == PROMPT else answers(request)

    fake_llm.rule = failing
    service = engine_of(sessions, model)
    await talk(service, "t:fail", 6)  # every turn answered
    row = await conversation_row(sessions, "t:fail")
    assert (row.summary, row.summary_through) == (None, None)
    async with sessions() as s:
        failed = list(await s.scalars(select(m.LLMCall).where(m.LLMCall.agent == AGENT)))
    # Tried once: a failing provider is not asked again on every message past the mark (agents.summary.RETRY_AFTER_S).
    assert len(failed) == 1 and not failed[0].ok and failed[0].error
    # The window keeps the whole history instead (the token budget still bounds it).
    fake_llm.requests.clear()
    await service.handle("t:fail", "still there?")
    await settle(service)
    request = next(r for r in fake_llm.requests if r.system != PROMPT)
    assert not any(s.startswith(EARLIER) for s in system_texts(request))
    assert "Message 0:" in str(next(msg for msg in request.messages if msg["role"] == "user")["content"])


async def test_the_summary_survives_a_restart(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI, database_url: str
) -> None:
    fake_llm.rule = answers
    await talk(engine_of(sessions, model), "t:restart", 8)
    row = await conversation_row(sessions, "t:restart")
    assert row.summary is not None

    # A new process: its own engine, model client and service; only Postgres is shared.
    engine = make_engine(database_url, pool_size=2)
    other = make_model(fake_llm)
    try:
        fake_llm.requests.clear()
        restarted = engine_of(make_sessions(engine), other)
        await restarted.handle("t:restart", "Back again.")
        await settle(restarted)
    finally:
        await other.close()
        await engine.dispose()
    [request] = [r for r in fake_llm.requests if r.system != PROMPT]
    assert EARLIER + row.summary in system_texts(request)
    assert "Message 0:" not in str(request.messages)


async def test_a_history_reset_outdates_the_summary(sessions: Sessions, model: Any, fake_llm: FakeOpenAI) -> None:
    fake_llm.rule = answers
    service = engine_of(sessions, model)
    await talk(service, "t:reset", 8)
    assert (await conversation_row(sessions, "t:reset")).summary is not None
    # What an admin's `reset` writes (escalation.desk): the agents start afresh after the last message.
    async with sessions() as s, s.begin():
        last = await s.scalar(select(func.max(m.Message.id)))
        await s.execute(update(m.Conversation).where(m.Conversation.key == "t:reset").values(history_from=last + 1))
    fake_llm.requests.clear()
    await service.handle("t:reset", "Starting over.")
    await settle(service)
    [request] = [r for r in fake_llm.requests if r.system != PROMPT]
    assert not any(s.startswith(EARLIER) for s in system_texts(request))
    assert [msg["content"] for msg in request.messages if msg["role"] == "user"] == ["Starting over."]
