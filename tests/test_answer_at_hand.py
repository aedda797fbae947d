"""Answer in one call when the answer is at hand (issue 16): an agent with a knowledge base is given the passages
for the customer's message before its first call, shown as `search_knowledge` shows them. Real Postgres with the
sample knowledge, the real OpenAI client, the fake LLM over HTTP (its embeddings too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import openai
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.agent import Roster
from agents.conversations import Conversations
from agents.identity import Author
from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import NOTHING_FOUND
from agents.model import OpenAIChatModel
from bot.examples.driftwing.shop import ORDERS
from escalation.machine import TAKEOVER
from fakes.openai_server import EMBEDDING_DIM, FakeOpenAI, reply, tool_call, tools
from harness.llm import CONFIG
from harness.sample import SAMPLE_KNOWLEDGE, default_roster

Sessions = async_sessionmaker[AsyncSession]
CITATION = "[1] Warranty and Driftwing Care › "


@pytest.fixture
async def roster(sessions: Sessions, fake_llm: FakeOpenAI) -> AsyncIterator[Roster]:
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    kb = KnowledgeBase(
        sessions=sessions, embedder=OpenAIEmbedder(client=client, model="fake-embed", dimensions=EMBEDDING_DIM)
    )
    await kb.ingest([SAMPLE_KNOWLEDGE / "support"], collection="support", root=SAMPLE_KNOWLEDGE)
    yield default_roster(kb, min_similarity=0.3)
    await client.close()


def service(sessions: Sessions, model: OpenAIChatModel, roster: Roster, entry: str = "support") -> Conversations:
    at = Roster.of(roster.agents.values(), entry=entry)
    return Conversations(takeover=TAKEOVER, sessions=sessions, roster=at, model=model, config=CONFIG)


def tool_results(request_messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in request_messages if m["role"] == "tool"]


async def test_a_knowledge_question_is_answered_in_one_call_with_the_passage_in_the_prompt(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("The standard warranty is 12 months [1] Warranty and Driftwing Care."))
    answer = await service(sessions, model, roster).handle("t:1", "how long is the standard warranty period?")
    assert answer.kind == "reply" and answer.agent == "support"
    assert len(fake_llm.requests) == 1
    messages = fake_llm.requests[0].messages
    called = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()]
    assert called == ["search_knowledge"]
    [passages] = tool_results(messages)
    assert CITATION in passages and "(support/warranty.md)" in passages and "cite" in passages
    # The stable prefix (system prompt, then the customer's message) comes first; the passages after it.
    assert messages[-1]["role"] == "tool" and messages[-3]["role"] == "user"

    # With no passage above the threshold there is no synthetic search; the model may still search itself.
    fake_llm.reset()
    fake_llm.script(tools(tool_call("search_knowledge", {"query": "xyzzy plugh qwerty"})), reply("Not found."))
    await service(sessions, model, roster).handle("t:3", "xyzzy plugh qwerty?")
    first, second = fake_llm.requests
    assert tool_results(first.messages) == [] and not any(m.get("tool_calls") for m in first.messages)
    assert tool_results(second.messages) == [NOTHING_FOUND]


async def test_after_a_handoff_only_the_agent_that_answers_gets_the_passages(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_support")), reply("12 months [1]."))
    await service(sessions, model, roster, entry="triage").handle("t:2", "how long is the standard warranty period?")
    triage, support = fake_llm.requests
    assert not any(CITATION in r for r in tool_results(triage.messages))
    assert any(CITATION in r for r in tool_results(support.messages))


async def test_the_search_tool_still_works_for_a_follow_up(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    conversation = service(sessions, model, roster)
    fake_llm.script(reply("12 months [1]."))
    await conversation.handle("t:4", "how long is the standard warranty period?")
    fake_llm.script(
        tools(tool_call("search_knowledge", {"query": "how do I return a drone for a refund"})), reply("Sure [1].")
    )
    await conversation.handle("t:4", "thanks. and xyzzy plugh?")
    first = fake_llm.requests[0].messages
    [prepared] = [c["id"] for m in first for c in m.get("tool_calls") or ()]
    assert any(CITATION in r for r in tool_results(first))
    follow_up = fake_llm.requests[-1].messages
    results = tool_results(follow_up)
    # The first turn's passages were answered from; the window leaves them out (the answer stays), call and
    # result together. The model's own search of this turn is there.
    ids = [c["id"] for m in follow_up for c in m.get("tool_calls") or ()]
    assert prepared not in ids and prepared not in [m.get("tool_call_id") for m in follow_up]
    assert "12 months [1]." in [m.get("content") for m in follow_up]
    assert "(support/returns" in results[-1]
    assert ids == [m["tool_call_id"] for m in follow_up if m["role"] == "tool"]


async def test_an_order_the_message_names_is_looked_up_before_the_first_call_for_its_owner_only(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    ben, ada = ORDERS["DW-1002"].customer, ORDERS["DW-1001"].customer
    fake_llm.script(reply("It shipped on the 12th."))
    answer = await service(sessions, model, roster).handle(
        "t:5", "hi, where is my order dw-1002?", author=Author("slack", "T1", "U_BEN", ben.name, ben.email)
    )
    assert answer.kind == "reply" and len(fake_llm.requests) == 1  # one call: the order was at hand
    messages = fake_llm.requests[0].messages
    called = [(c["function"]["name"], c["function"]["arguments"]) for m in messages for c in m.get("tool_calls") or ()]
    assert ("lookup_order", '{"order_id": "DW-1002"}') in called
    assert any(r.startswith("Order DW-1002 for Ben Ortiz") for r in tool_results(messages))
    # The agent's name for the writer comes from their chat profile, in what is known about the conversation.
    assert any('"writer": "Ben Ortiz"' in str(m["content"]) for m in messages if m["role"] == "system")

    # Someone else naming the same order: the look-up runs through the tool's own check, and finds nothing.
    fake_llm.reset()
    fake_llm.script(reply("I can't find that order on your account."))
    await service(sessions, model, roster).handle(
        "t:6", "where is order DW-1002?", author=Author("slack", "T1", "U_ADA", ada.name, ada.email)
    )
    results = tool_results(fake_llm.requests[0].messages)
    assert not any("Ben" in r or "Harrier" in r for r in results)
    assert any(r.startswith("No order 'DW-1002' on the account of the person asking") for r in results)


async def test_without_prefetch_the_model_looks_the_order_up_itself(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    ben = ORDERS["DW-1002"].customer
    at = Roster.of(roster.agents.values(), entry="support")
    off = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=at, model=model, config=replace(CONFIG, prefetch=False)
    )
    fake_llm.script(tools(tool_call("lookup_order", {"order_id": "DW-1002"})), reply("It shipped."))
    await off.handle("t:7", "where is DW-1002?", author=Author("slack", "T1", "U_BEN", ben.name, ben.email))
    first, _ = fake_llm.requests
    assert not any(c["function"]["name"] == "lookup_order" for m in first.messages for c in m.get("tool_calls") or ())


async def test_after_a_transfer_the_look_ups_already_made_stay_in_the_new_agents_window(
    sessions: Sessions, model: OpenAIChatModel, roster: Roster, fake_llm: FakeOpenAI
) -> None:
    # A real small model transferred after the order was looked up; the agent it reached must be able to answer
    # from that look-up rather than start again (or answer nothing).
    ben = ORDERS["DW-1002"].customer
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply("It shipped; want a spare battery too?"))
    answer = await service(sessions, model, roster).handle(
        "t:8",
        "where is my order DW-1002? and which spare battery fits it?",
        author=Author("slack", "T1", "U_BEN", ben.name, ben.email),
    )
    assert answer.kind == "reply" and answer.agent == "sales"
    support, sales = fake_llm.requests
    assert any(r.startswith("Order DW-1002 for Ben Ortiz") for r in tool_results(support.messages))
    assert any(r.startswith("Order DW-1002 for Ben Ortiz") for r in tool_results(sales.messages))
    # Each call and its result stay paired, so the provider accepts the window.
    ids = [c["id"] for m in sales.messages for c in m.get("tool_calls") or ()]
    assert ids == [m["tool_call_id"] for m in sales.messages if m["role"] == "tool"]
