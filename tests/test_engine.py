"""The handoff engine end to end: real Postgres, the real openai SDK over HTTP to the scripted fake."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from sqlalchemy import Connection, event, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.conversations import Conversations, TurnCommit
from agents.db import models as m
from agents.db.deliveries import AddReaction, Delivery, Post, Source, delivery_of, enqueue
from agents.db.statements import Conn
from agents.identity import Author
from agents.leases import LeaseLost
from agents.texts import Text
from agents.tools import HandoffTo
from bot.examples.driftwing.shop import ORDERS
from bot.playground.waiting import poll
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, RecordedRequest, cached, error, reply, slow, tool_call, tools
from harness.database import DriverLog
from harness.llm import CONFIG, make_model
from harness.sample import default_roster

Sessions = async_sessionmaker[AsyncSession]


async def rows(sessions: Sessions, model: Any, *where: Any) -> list[Any]:
    async with sessions() as s:
        return list((await s.scalars(select(model).where(*where).order_by(model.id))).all())


def tool_messages(request: RecordedRequest) -> list[dict[str, Any]]:
    return [msg for msg in request.messages if msg["role"] == "tool"]


async def test_direct_answer(service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions) -> None:
    fake_llm.script(reply("Hello! How can I help?"))
    result = await service.handle("t:1", "hi")
    assert (result.kind, result.reply, result.agent) == ("reply", "Hello! How can I help?", "triage")
    transcript = await rows(sessions, m.Message)
    assert [(r.role, r.agent, r.content) for r in transcript] == [
        ("user", None, "hi"),
        ("assistant", "triage", "Hello! How can I help?"),
    ]
    request = fake_llm.requests[0]
    assert "front desk" in request.system
    assert request.tool_names == [
        "record_customer_name",
        "transfer_to_sales",
        "transfer_to_support",
        "escalate_to_human",
    ]
    [call] = await rows(sessions, m.LLMCall)
    assert call.ok and call.prompt_tokens > 0 and call.agent == "triage"


async def test_handoff_and_answer_in_same_turn(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_sales", {"reason": "wants a camera drone"})),
        reply("The Harrier X4 is a great pick."),
    )
    result = await service.handle("t:1", "I want a drone for photos")
    assert (result.kind, result.agent, result.reply) == ("reply", "sales", "The Harrier X4 is a great pick.")
    assert [(h.from_agent, h.to_agent, h.reason) for h in result.handoffs] == [
        ("triage", "sales", "wants a camera drone")
    ]
    second = fake_llm.requests[1]
    assert "You are Sales" in second.system
    # The new agent sees the conversation so far: the question, the transfer call and its result.
    assert second.last_user == "I want a drone for photos"
    assert "Transferred to Sales" in tool_messages(second)[0]["content"]
    [handoff] = await rows(sessions, m.Handoff)
    assert (handoff.from_agent, handoff.to_agent) == ("triage", "sales")
    state = await service.state("t:1")
    assert state is not None and state.agent == "sales"


async def test_follow_up_continues_with_new_agent_after_restart(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions, database_url: str
) -> None:
    from agents.db.engine import make_engine, make_sessions

    fake_llm.script(tools(tool_call("transfer_to_support")), reply("Let me look at that order."))
    await service.handle("t:1", "my order is late")

    # A new process: its own SQLAlchemy engine, model client and service; only Postgres is shared.
    engine = make_engine(database_url, pool_size=2)
    model = make_model(fake_llm)
    restarted = Conversations(
        takeover=TAKEOVER, sessions=make_sessions(engine), roster=default_roster(), model=model, config=CONFIG
    )
    fake_llm.script(reply("Order DW-1002 is on its way."))
    result = await restarted.handle("t:1", "it's DW-1002")
    await model.close()
    await engine.dispose()
    assert result.agent == "support"
    request = fake_llm.requests[-1]
    assert "You are Support" in request.system
    assert [msg["content"] for msg in request.messages if msg["role"] == "user"] == ["my order is late", "it's DW-1002"]


async def test_hand_back_to_triage(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply("Which budget?"))
    await service.handle("t:1", "which drone should I buy")
    fake_llm.script(tools(tool_call("transfer_to_triage", {"reason": "done shopping"})), reply("Anything else?"))
    result = await service.handle("t:1", "actually, where is your office?")
    assert result.agent == "triage"
    assert [(h.from_agent, h.to_agent) for h in result.handoffs] == [("sales", "triage")]


async def test_specialist_to_specialist(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply("Here are our drones."))
    await service.handle("t:1", "show me drones")
    fake_llm.script(tools(tool_call("transfer_to_support")), reply("Sorry it broke; which order?"))
    result = await service.handle("t:1", "my last one broke though")
    assert [(h.from_agent, h.to_agent) for h in result.handoffs] == [("sales", "support")]
    assert result.agent == "support"


async def test_parallel_tool_calls_run_concurrently(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from agents.agent import Agent, Roster
    from agents.tools import function_tool

    running = 0
    peak = 0

    @function_tool
    async def slow_lookup(code: str) -> str:
        """Look something up slowly."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.2)
        running -= 1
        return f"info about {code}"

    roster = Roster.of([Agent("solo", "Solo", "Does it all.", "Be helpful.", tools=(slow_lookup,))], entry="solo")
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=roster, model=model, config=CONFIG)
    fake_llm.script(
        tools(*(tool_call("slow_lookup", {"code": c}) for c in ("A", "B", "C"))),
        reply("All three found."),
    )
    result = await service.handle("t:1", "look up A, B and C")
    assert result.reply == "All three found."
    assert peak == 3
    results = tool_messages(fake_llm.requests[1])
    assert [r["content"] for r in results] == ["info about A", "info about B", "info about C"]


async def test_parallel_tools_respect_the_bound(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from dataclasses import replace

    from agents.agent import Agent, Roster
    from agents.tools import function_tool

    running = 0
    peak = 0

    @function_tool
    async def slow_lookup(code: str) -> str:
        """Look something up slowly."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return code

    roster = Roster.of([Agent("solo", "Solo", "Does it all.", "Be helpful.", tools=(slow_lookup,))], entry="solo")
    config = replace(CONFIG, max_parallel_tools=2)
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=roster, model=model, config=config)
    fake_llm.script(tools(*(tool_call("slow_lookup", {"code": str(i)}) for i in range(6))), reply("done"))
    await service.handle("t:1", "six lookups")
    assert peak == 2


async def _bad_call_then_reply(service: Conversations, fake: FakeOpenAI, call: Any) -> tuple[Any, str]:
    fake.script(tools(call), reply("Sorry, let me try differently."))
    result = await service.handle("t:1", "where is DW-1001?")
    return result, tool_messages(fake.requests[-1])[0]["content"]


async def test_invalid_json_arguments_go_back_as_error(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(tools(tool_call("transfer_to_support")), reply("ok"))
    await service.handle("t:0", "order question")  # put support (with lookup_order) in charge of t:0
    fake_llm.script(tools(tool_call("lookup_order", '{"order_id": "DW-1001"')), reply("Let me retry."))
    result = await service.handle("t:0", "where is DW-1001?")
    content = tool_messages(fake_llm.requests[-1])[-1]["content"]
    assert result.reply == "Let me retry."
    assert "not valid JSON" in content


async def test_wrong_argument_types_go_back_as_error(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    result, content = await _bad_call_then_reply(service, fake_llm, tool_call("record_customer_name", {"name": 42}))
    assert result.kind == "reply"
    assert "invalid arguments" in content and "name" in content
    [run] = await rows(sessions, m.ToolRun)
    assert not run.ok


async def test_missing_and_extra_arguments_go_back_as_error(service: Conversations, fake_llm: FakeOpenAI) -> None:
    _, content = await _bad_call_then_reply(service, fake_llm, tool_call("record_customer_name", {"nom": "Ada"}))
    assert "name: Field required" in content and "nom" in content


async def test_unknown_tool_goes_back_as_error(service: Conversations, fake_llm: FakeOpenAI) -> None:
    result, content = await _bad_call_then_reply(service, fake_llm, tool_call("launch_missiles", {}))
    assert result.reply == "Sorry, let me try differently."
    assert "no tool named 'launch_missiles'" in content


async def test_tool_that_raises_goes_back_as_error(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from agents.agent import Agent, Roster
    from agents.tools import function_tool

    @function_tool
    async def flaky() -> str:
        """Always fails."""
        raise ConnectionError("inventory service down")

    roster = Roster.of([Agent("solo", "Solo", "Does it all.", "Be helpful.", tools=(flaky,))], entry="solo")
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=roster, model=model, config=CONFIG)
    fake_llm.script(tools(tool_call("flaky")), reply("The stock system is down, sorry."))
    result = await service.handle("t:1", "in stock?")
    assert result.reply == "The stock system is down, sorry."
    assert "ConnectionError: inventory service down" in tool_messages(fake_llm.requests[1])[0]["content"]
    [run] = await rows(sessions, m.ToolRun)
    assert (run.tool, run.ok) == ("flaky", False)


async def test_two_handoffs_in_one_response_first_wins(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support"), tool_call("transfer_to_sales")),
        reply("Support here."),
    )
    result = await service.handle("t:1", "help")
    assert result.agent == "support"
    first, second = tool_messages(fake_llm.requests[1])
    assert "Transferred to Support" in first["content"]
    assert second["content"].startswith("Error: not performed")


async def test_escalation_wins_over_handoff(service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales"), tool_call("escalate_to_human", {"reason": "angry"})))
    result = await service.handle("t:1", "I want a person NOW")
    assert result.kind == "escalated"
    assert result.handoffs == ()
    [esc] = await rows(sessions, m.Escalation)
    assert (esc.reason, esc.trigger, esc.agent, esc.status) == ("angry", "agent", "triage", "open")
    state = await service.state("t:1")
    assert state is not None and state.mode == "awaiting_human"
    # While a human owns it, the bot stays quiet but keeps the message.
    later = await service.handle("t:1", "hello?")
    assert (later.kind, later.reply) == ("human", None)
    assert fake_llm.calls == 1
    assert [r.content for r in await rows(sessions, m.Message, m.Message.role == "user")] == [
        "I want a person NOW",
        "hello?",
    ]


async def test_handoff_budget_runs_out(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from dataclasses import replace

    service = Conversations(
        takeover=TAKEOVER,
        sessions=sessions,
        roster=default_roster(),
        model=model,
        config=replace(CONFIG, max_handoffs=1),
    )
    fake_llm.script(tools(tool_call("transfer_to_sales")), tools(tool_call("transfer_to_support")))
    result = await service.handle("t:1", "buy and return")
    assert result.kind == "escalated"
    assert result.reply == CONFIG.texts.get(Text.BUDGET_MESSAGE)
    [esc] = await rows(sessions, m.Escalation)
    assert (esc.trigger, esc.agent) == ("budget", "sales")


async def test_ping_pong_is_stopped(service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), tools(tool_call("transfer_to_triage")))
    result = await service.handle("t:1", "hmm")
    assert result.kind == "escalated"
    [esc] = await rows(sessions, m.Escalation)
    assert esc.trigger == "ping_pong" and "triage -> sales -> triage" in esc.reason


async def test_llm_call_budget_runs_out(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from dataclasses import replace

    service = Conversations(
        takeover=TAKEOVER,
        sessions=sessions,
        roster=default_roster(),
        model=model,
        config=replace(CONFIG, max_llm_calls=3),
    )
    fake_llm.rule = lambda _: tools(tool_call("record_customer_name", {"name": "Ada"}))
    result = await service.handle("t:1", "I'm Ada")
    assert result.kind == "escalated" and fake_llm.calls == 3


async def test_llm_500s_apologise_escalate_and_keep_message(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    model = make_model(fake_llm, max_retries=1)
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG)
    fake_llm.script(error(500), error(503))
    result = await service.handle("t:1", "my drone is on fire")
    await model.close()
    assert fake_llm.calls == 2  # the SDK retried once, as configured
    assert (result.kind, result.reply) == ("escalated", CONFIG.texts.get(Text.PROVIDER_FAILURE_MESSAGE))
    transcript = await rows(sessions, m.Message)
    assert [(r.role, r.content) for r in transcript] == [
        ("user", "my drone is on fire"),
        ("assistant", CONFIG.texts.get(Text.PROVIDER_FAILURE_MESSAGE)),
    ]
    [esc] = await rows(sessions, m.Escalation)
    assert esc.trigger == "provider"
    [call] = await rows(sessions, m.LLMCall)
    assert not call.ok and call.error is not None and "server" in call.error


async def test_llm_timeout_apologises_and_escalates(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    model = make_model(fake_llm, timeout_s=0.2)
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG)
    fake_llm.script(slow(2.0, reply("too late")))
    result = await service.handle("t:1", "hello")
    await model.close()
    assert result.kind == "escalated"
    [esc] = await rows(sessions, m.Escalation)
    assert esc.trigger == "provider" and "timeout" in esc.reason


async def test_rate_limit_after_partial_progress_keeps_the_handoff(
    service: Conversations, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_support")), error(429))
    result = await service.handle("t:1", "refund please")
    assert result.kind == "escalated" and result.agent == "support"


async def test_window_bound_keeps_tool_pairs(sessions: Sessions, fake_llm: FakeOpenAI, model: Any) -> None:
    from dataclasses import replace

    service = Conversations(
        takeover=TAKEOVER,
        sessions=sessions,
        roster=default_roster(),
        model=model,
        config=replace(CONFIG, token_budget=1500),
    )
    for i in range(12):
        fake_llm.script(
            tools(tool_call("record_customer_name", {"name": f"Customer {i} " + "x" * 150})),
            reply(f"Noted, number {i}. " + "y" * 200),
        )
        await service.handle("t:1", f"message {i} " + "z" * 200)
    last = fake_llm.requests[-1].messages
    history = [msg for msg in last if msg["role"] != "system"]
    assert len(history) < 12 * 4
    assert history[0]["role"] == "user"  # the oldest whole unit starts cleanly
    for index, msg in enumerate(history):
        if msg["role"] == "tool":
            call_ids = [c["id"] for prior in history[:index] for c in prior.get("tool_calls") or []]
            assert msg["tool_call_id"] in call_ids
        if msg.get("tool_calls"):
            answered = {x["tool_call_id"] for x in history if x["role"] == "tool"}
            assert all(c["id"] in answered for c in msg["tool_calls"])
    assert "message 11" in history[-3]["content"] or "message 11" in json.dumps(history)
    assert len(await rows(sessions, m.Message)) == 12 * 4  # Postgres keeps everything


async def test_context_is_shared_and_persisted(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(tools(tool_call("record_customer_name", {"name": "Ada"})), reply("Hi Ada!"))
    await service.handle("t:1", "I'm Ada")
    fake_llm.script(reply("Sure, Ada."))
    await service.handle("t:1", "thanks")
    assert '"customer_name": "Ada"' in fake_llm.requests[-1].messages[1]["content"]
    state = await service.state("t:1")
    assert state is not None and state.context == {"customer_name": "Ada"}


async def test_refund_needs_confirmation_and_is_idempotent(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    refund = tool_call("issue_refund", {"order_id": "DW-1001", "confirmed": True})
    # The model tries to confirm on the customer's behalf in the very turn it first asks: refused.
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("issue_refund", {"order_id": "DW-1001"})),
        tools(refund),
        reply("Shall I refund $349.00 for DW-1001?"),
    )
    ada = Author("test", None, "U_ADA", "Ada Park", ORDERS["DW-1001"].customer.email)
    await service.handle("t:1", "refund DW-1001 please", author=ada)
    assert await rows(sessions, m.Refund) == []
    assert "Not refunded yet" in tool_messages(fake_llm.requests[-1])[-1]["content"]
    fake_llm.script(tools(refund), reply("Done."))
    await service.handle("t:1", "yes please", author=ada)
    assert "Refunded $349.00" in tool_messages(fake_llm.requests[-1])[-1]["content"]
    fake_llm.script(tools(refund), reply("Already done."))
    await service.handle("t:1", "yes, refund it again", author=ada)
    assert "already refunded" in tool_messages(fake_llm.requests[-1])[-1]["content"]
    [row] = await rows(sessions, m.Refund)
    assert (row.order_id, row.amount_cents) == ("DW-1001", 34900)


async def test_streaming_mode(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    model = make_model(fake_llm, stream=True)
    service = Conversations(takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG)
    fake_llm.script(tools(tool_call("transfer_to_sales", {"reason": "browsing"})), reply("Streaming hello from Sales."))
    result = await service.handle("t:1", "drones?")
    await model.close()
    assert all(r.stream for r in fake_llm.requests)
    assert (result.agent, result.reply) == ("sales", "Streaming hello from Sales.")
    assert result.handoffs[0].reason == "browsing"
    [call, _] = await rows(sessions, m.LLMCall)
    assert call.prompt_tokens > 0


async def test_concurrent_messages_in_one_conversation_run_in_order(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    def answer(request: RecordedRequest) -> Any:
        return slow(0.15, reply(f"re: {request.last_user}"))

    fake_llm.rule = answer
    first = asyncio.create_task(service.handle("t:1", "first"))
    await asyncio.sleep(0.05)  # arrival order: first, then second
    second = asyncio.create_task(service.handle("t:1", "second"))
    results = await asyncio.gather(first, second)
    assert [r.reply for r in results] == ["re: first", "re: second"]
    transcript = [(r.role, r.content) for r in await rows(sessions, m.Message)]
    assert transcript == [
        ("user", "first"),
        ("assistant", "re: first"),
        ("user", "second"),
        ("assistant", "re: second"),
    ]
    # The second turn saw the first one complete: no interleaving.
    assert [msg["content"] for msg in fake_llm.requests[1].messages[1:]] == ["first", "re: first", "second"]


async def test_fifty_conversations_in_parallel(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.rule = lambda request: slow(0.05, reply(f"echo {request.last_user}"))
    results = await asyncio.gather(*(service.handle(f"t:{i}", f"question {i}") for i in range(50)))
    assert [r.reply for r in results] == [f"echo question {i}" for i in range(50)]
    async with sessions() as s:
        assert await s.scalar(select(func.count()).select_from(m.Conversation)) == 50
        assert await s.scalar(select(func.count()).select_from(m.Inbound).where(m.Inbound.processed_at.is_(None))) == 0


async def test_crash_mid_turn_keeps_message_and_resumes(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(5.0, reply("never delivered")))
    task = asyncio.create_task(service.handle("t:1", "are you there?"))
    await asyncio.sleep(0.3)
    task.cancel()  # the process dies mid-turn: its transaction never commits
    await asyncio.gather(task, return_exceptions=True)
    [inbound] = await rows(sessions, m.Inbound)
    assert inbound.processed_at is None and inbound.text == "are you there?"
    assert await rows(sessions, m.Message) == []

    fake_llm.reset()
    fake_llm.script(reply("Yes, I'm here."))
    assert await service.pending_conversations() == [inbound.conversation_id]
    result = await service.process_next(inbound.conversation_id)
    assert result is not None and result.reply == "Yes, I'm here."
    assert await service.pending_conversations() == []


async def test_duplicate_external_id_is_stored_once(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("one answer"))
    first = await service.handle("t:1", "hi", external_id="ev-1")
    again = await service.submit("t:1", "hi", external_id="ev-1")
    assert again.duplicate and again.inbound_id == first.inbound_id
    assert await service.result_of(again.inbound_id) == first
    assert fake_llm.calls == 1


async def test_storing_a_message_never_waits_for_a_reopened_turn(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    from sqlalchemy import update

    fake_llm.script(reply("first"))
    await service.handle("t:1", "hello")
    async with sessions() as s, s.begin():
        await s.execute(update(m.Conversation).values(mode="closed", active_agent="sales"))
    fake_llm.script(slow(1.5, reply("welcome back")), reply("and again"))
    turn = asyncio.create_task(service.handle("t:1", "I'm back"))
    await asyncio.sleep(0.3)  # the reopened turn is now waiting on the model, holding the conversation lock
    await service.submit("t:1", "one more thing")
    assert not turn.done()  # the message was stored while the turn was still running
    result = await turn
    assert (result.reply, result.agent) == ("welcome back", "triage")
    state = await service.state("t:1")
    assert state is not None and state.mode == "bot"


async def test_an_empty_answer_is_asked_again_and_not_kept(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply(""), reply("Here you go."))
    result = await service.handle("t:1", "hi")
    assert result.reply == "Here you go."
    assert all(msg.get("content") is not None for msg in fake_llm.requests[1].messages)
    assert [r.content for r in await rows(sessions, m.Message)] == ["hi", "Here you go."]


async def test_first_valid_transfer_wins_over_a_refused_one(service: Conversations, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support")),
        tools(tool_call("transfer_to_triage"), tool_call("transfer_to_sales")),  # back to triage is ping-pong
        reply("Sales here."),
    )
    result = await service.handle("t:1", "help")
    assert result.kind == "reply" and result.agent == "sales"
    refused, taken = tool_messages(fake_llm.requests[2])[-2:]
    assert "ping-pong" in refused["content"] and "Transferred to Sales" in taken["content"]


async def test_tool_handing_to_a_forbidden_agent_or_hanging_goes_back_as_error(
    sessions: Sessions, fake_llm: FakeOpenAI, model: Any
) -> None:
    from dataclasses import replace

    from agents.agent import Agent, Roster
    from agents.tools import function_tool

    @function_tool
    async def sneaky() -> HandoffTo:
        """Tries to move the conversation somewhere it may not go."""
        return HandoffTo("billing")

    @function_tool
    async def stuck() -> str:
        """Never answers."""
        await asyncio.sleep(10)
        return "late"

    roster = Roster.of([Agent("solo", "Solo", "Does it all.", "Be helpful.", tools=(sneaky, stuck))], entry="solo")
    service = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=roster, model=model, config=replace(CONFIG, tool_timeout_s=0.2)
    )
    fake_llm.script(tools(tool_call("sneaky"), tool_call("stuck")), reply("Sorry, neither worked."))
    result = await service.handle("t:1", "go")
    assert result.reply == "Sorry, neither worked." and result.agent == "solo"
    first, second = tool_messages(fake_llm.requests[1])
    assert "cannot transfer to 'billing'" in first["content"]
    assert "did not answer within 0.2 s" in second["content"]


async def test_a_message_that_keeps_killing_the_process_ends_with_a_human(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    from sqlalchemy import update

    submitted = await service.submit("t:1", "the message that crashes everything")
    async with sessions() as s, s.begin():  # three earlier attempts died with their process
        await s.execute(update(m.Inbound).values(attempts=3))
    result = await service.process_next()
    assert result is not None and result.kind == "escalated"
    assert result.reply == CONFIG.texts.get(Text.PROVIDER_FAILURE_MESSAGE)
    assert fake_llm.calls == 0
    [esc] = await rows(sessions, m.Escalation)
    assert esc.trigger == "error" and esc.inbound_id == submitted.inbound_id


async def test_first_messages_of_a_new_conversation_stored_at_once_share_it(service: Conversations) -> None:
    """Storing is one statement that reads the conversation and creates it when missing: two first messages at
    once (Slack's message and app_mention twins, two deliveries) meet in the upsert and land in one
    conversation, neither lost; the same external id twice is one message."""
    stored = await asyncio.gather(
        *(service.submit("t:race", f"message {i}", external_id=f"ts-{i % 4}") for i in range(8))
    )
    assert len({s.conversation_id for s in stored}) == 1
    assert len({s.inbound_id for s in stored}) == 4
    assert sum(not s.duplicate for s in stored) == 4


async def test_cached_tokens_are_stored_and_none_when_the_provider_does_not_say(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(
        cached(256, tools(tool_call("transfer_to_sales", {"reason": "wants a drone"}))),
        cached(None, reply("Which budget?")),  # as Ollama answers: no prompt_tokens_details
    )
    await service.handle("t:1", "I want a drone")
    assert [c.cached_tokens for c in await rows(sessions, m.LLMCall)] == [256, None]


async def test_the_prompt_prefix_is_stable_from_call_to_call(
    service: Conversations, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """What a provider's prompt cache serves: the tools, the instructions and the history up to the new message
    are the same bytes as in the call before (no timestamp or other per-turn text ahead of the history)."""
    fake_llm.prompt_cache = True
    fake_llm.rule = lambda request: reply(f"Answer {len(request.messages)}.")
    for n in range(3):
        await service.handle("t:1", f"question {n}")
    requests = fake_llm.requests
    for before, after in itertools.pairwise(requests):
        assert after.tools == before.tools and after.messages[: len(before.messages)] == before.messages
    # Each call after the first finds all of the call before it in the cache, but its closing bracket.
    earlier = [len(json.dumps(r.tools) + json.dumps(r.messages)) - 1 for r in requests[:-1]]
    assert [c.cached_tokens for c in await rows(sessions, m.LLMCall)] == [0] + [n // 4 for n in earlier]


async def test_a_message_costs_three_statements_that_commit_alone_and_one_transaction(
    sessions: Sessions, engine: AsyncEngine, model: Any, fake_llm: FakeOpenAI
) -> None:
    """Storing a message, claiming its conversation and starting its turn are one statement each, committed by
    themselves: no BEGIN and COMMIT round trips around them. The turn's commit, with the host's rows, is the one
    transaction. All on the driver's own connection: none goes through SQLAlchemy's."""

    async def host(conn: Conn, commit: TurnCommit) -> None:
        await enqueue(conn, [Post(commit.conversation_id, "C1", "1.0", commit.result.reply or "")])

    service = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG, after_turn=host
    )
    fake_llm.script(reply("Hello!"))
    through_sqlalchemy: list[str] = []

    def executed(conn: Connection, _: Any, statement: str, *__: Any) -> None:
        through_sqlalchemy.append(statement.split()[0])

    event.listen(engine.sync_engine, "before_cursor_execute", executed)
    try:
        with DriverLog(engine) as driver:
            await service.submit("test:costs", "hi")
            [lease] = await service.leases.claim_pending(1)
            [result] = await service.run_leased(lease)
            run = DriverLog.first_words(await driver.settled())
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", executed)
    assert result.reply == "Hello!"
    # Store, claim and start outside any transaction; the turn's commit and the host's outbox row in one.
    assert run == ["WITH", "UPDATE", "WITH", "BEGIN", "WITH", "INSERT", "COMMIT"]
    assert through_sqlalchemy == []
    assert await rows(sessions, m.Outbox) != []


class KnownRows:
    """A host whose rows are known before the turn commits (as the bot's outbox is for an answer)."""

    def __init__(self) -> None:
        self.in_transaction = 0

    async def __call__(self, conn: Conn, commit: TurnCommit) -> None:
        self.in_transaction += 1
        await enqueue(conn, self.owed(commit))

    def owed(self, commit: TurnCommit) -> list[Delivery]:
        cid = commit.conversation_id
        return [
            Post(
                cid,
                "C1",
                "1.0",
                f"{commit.result.reply} (1 of 2)",
                answer=True,
                sources=(Source("Returns", None, "kb"),),
            ),
            Post(cid, "C1", "1.0", "(2 of 2)"),
            AddReaction(cid, "C1", "1.0", "white_check_mark"),
        ]


async def test_a_turn_whose_rows_are_known_queues_them_in_its_own_statement(
    sessions: Sessions, engine: AsyncEngine, model: Any, fake_llm: FakeOpenAI
) -> None:
    """A host that knows a turn's rows before the commit (no case is opened, whose id they would carry) has them
    queued by the turn's commit statement: no BEGIN and COMMIT around it, the rows in their order and as
    `enqueue` writes them. A turn that opens a case keeps the transaction, its rows carrying the case."""
    host = KnownRows()
    service = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG, after_turn=host
    )
    fake_llm.script(reply("Hello!"))
    with DriverLog(engine) as driver:
        await service.submit("test:known", "hi")
        [lease] = await service.leases.claim_pending(1)
        [result] = await service.run_leased(lease)
        run = DriverLog.first_words(await driver.settled())
    assert result.reply == "Hello!" and host.in_transaction == 0
    assert run == ["WITH", "UPDATE", "WITH", "WITH"]  # store, claim, start, and the commit with its rows
    queued = [delivery_of(row._mapping) for row in await outbox_rows(sessions)]
    assert queued == host.owed(TurnCommit("test:known", lease.conversation_id, None, None, "hi", result))

    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    await service.submit("test:known", "a person, please")
    [lease] = await service.leases.claim_pending(1)
    [result] = await service.run_leased(lease)
    assert result.escalation_id is not None and host.in_transaction == 1


async def test_a_turn_that_lost_its_lease_queues_none_of_its_known_rows(
    sessions: Sessions, model: Any, fake_llm: FakeOpenAI
) -> None:
    host = KnownRows()
    service = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG, after_turn=host
    )
    fake_llm.script(slow(0.5, reply("Hello!")))
    await service.submit("test:lost", "hi")
    [lease] = await service.leases.claim_pending(1)
    turn = asyncio.create_task(service.run_leased(lease))
    await poll(lambda: fake_llm.calls >= 1, 10, lambda: "the turn did not call the model")
    async with sessions() as s, s.begin():  # taken over meanwhile by another process
        await s.execute(update(m.Conversation).values(lease_owner="another process"))
    with pytest.raises(LeaseLost):
        await turn
    assert await outbox_rows(sessions) == []


async def outbox_rows(sessions: Sessions) -> list[Any]:
    async with sessions() as s:
        return list((await s.execute(select(*m.Outbox.__table__.columns).order_by(m.Outbox.id))).all())
