"""Routing without a call (issue 16): the router (agents.router) with the static table distilled from MiniLM and
the shipped agents' examples, and the engine switching before the first call when it is sure. Real Postgres, the
real OpenAI client, the fake LLM over HTTP."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.agent import Roster
from agents.conversations import Conversations
from agents.db import models as m
from agents.knowledge.local import LocalEmbedder, MiniLM
from agents.knowledge.static import StaticEmbedder, StaticModel
from agents.knowledge.store import KnowledgeBase
from agents.model import OpenAIChatModel
from agents.router import MIN_SCORE, Router, acts_on
from bot.runtime.startup import calibrated_router
from bot.settings import Settings
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, reply
from harness.llm import CONFIG
from harness.sample import default_roster

Sessions = async_sessionmaker[AsyncSession]
SALES_MESSAGE = "which drone should I buy for shooting landscape photos?"


@cache
def minilm() -> MiniLM:
    return MiniLM()  # loaded once for the module: a second per load on a busy machine


@cache
def table() -> StaticModel:
    return StaticModel()


def router(roster: Roster, min_score: float = MIN_SCORE) -> Router:
    """As the bot routes: with the static table, at the threshold calibrated for it."""
    examples = {name: agent.examples for name, agent in roster.agents.items()}
    return Router(StaticEmbedder(table()), examples, min_score=min_score)


def service(sessions: Sessions, model: OpenAIChatModel, roster: Roster) -> Conversations:
    return Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=roster, model=model, config=CONFIG, router=router(roster)
    )


async def handoffs(sessions: Sessions) -> list[tuple[str, str, str | None]]:
    async with sessions() as s:
        rows = await s.scalars(select(m.Handoff).order_by(m.Handoff.id))
        return [(h.from_agent, h.to_agent, h.reason) for h in rows]


async def test_the_router_names_the_agent_when_sure_and_abstains_under_its_threshold() -> None:
    roster = default_roster()
    routed = await router(roster).route(SALES_MESSAGE)
    assert routed is not None and routed.agent == "sales" and routed.score >= MIN_SCORE
    assert await router(roster, min_score=routed.score + 0.01).route(SALES_MESSAGE) is None
    assert await router(roster).route("hmm, about my drone") is None


async def test_a_clear_sales_message_at_triage_goes_to_sales_without_the_triage_call(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("For landscapes the Osprey Pro 8K is the one."))
    answer = await service(sessions, model, default_roster()).handle("t:r1", SALES_MESSAGE)
    assert answer.kind == "reply" and answer.agent == "sales"
    assert len(fake_llm.requests) == 1
    assert fake_llm.requests[0].system.startswith("You are Sales at Driftwing Drones")
    [(source, target, reason)] = await handoffs(sessions)
    assert (source, target) == ("triage", "sales") and reason is not None and reason.startswith("router 0.")


async def test_an_ambiguous_message_is_routed_by_the_triage_call_as_before(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("Happy to help: what about your drone?"))
    answer = await service(sessions, model, default_roster()).handle("t:r2", "hmm, about my drone")
    assert answer.agent == "triage"
    assert fake_llm.requests[0].system.startswith("You are the front desk")
    assert await handoffs(sessions) == []


async def test_a_customer_asking_for_a_person_is_not_routed_to_an_agent(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("Of course."))
    await service(sessions, model, default_roster()).handle("t:r3", "my order never arrived, let me talk to a person")
    assert fake_llm.requests[0].system.startswith("You are the front desk")
    assert await handoffs(sessions) == []


async def test_no_switch_to_an_agent_the_active_one_cannot_hand_off_to(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    sample = default_roster()
    roster = Roster.of(
        (replace(sample["triage"], handoffs=("support",)), sample["sales"], sample["support"]), entry="triage"
    )
    fake_llm.script(reply("Let me see."))
    await service(sessions, model, roster).handle("t:r4", SALES_MESSAGE)
    assert fake_llm.requests[0].system.startswith("You are the front desk")
    assert await handoffs(sessions) == []


def test_a_route_back_to_the_front_desk_is_taken_only_for_a_question() -> None:
    assert acts_on("triage", entry="triage", text="Thanks. What are your opening hours?")
    assert not acts_on("triage", entry="triage", text="Perfect, thanks.")  # stays with the specialist following up
    assert acts_on("sales", entry="triage", text="thanks, and the battery")


def test_a_specialists_question_answered_with_a_product_name_stays_with_the_specialist() -> None:
    # Support asked "which model do you have?"; "the Harrier X4" reads like sales' but answers support.
    assert not acts_on("sales", entry="triage", active="support", text="the Harrier X4", answering=True)
    assert acts_on("sales", entry="triage", active="support", text="and do you sell guards for it?", answering=True)
    assert acts_on("sales", entry="triage", active="support", text="I want to buy a Harrier X4", answering=False)
    assert acts_on("support", entry="triage", active="triage", text="my order DW-1002 is late", answering=True)


class CountedEmbedder(LocalEmbedder):
    def __init__(self) -> None:
        super().__init__(minilm())
        self.texts: list[str] = []

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.texts += texts
        return await super().embed(texts)


async def test_the_router_embeds_with_the_static_table_and_the_search_with_the_knowledge_bases_model(
    sessions: Sessions, tmp_path: Path
) -> None:
    """As the bot wires them (`calibrated_router`): the router looks the message up in the static table, whatever
    the knowledge base searches with; MiniLM embeds it once, for the search."""
    embedder = CountedEmbedder()
    kb = KnowledgeBase(sessions=sessions, embedder=embedder)
    (tmp_path / "drones.md").write_text("# Drones\n\n## Landscape\n\nThe Harrier X4 shoots landscapes in 4K.")
    await kb.ingest([tmp_path / "drones.md"], collection="catalogue", root=tmp_path)
    settings = Settings(_env_file=None, router_min_score=MIN_SCORE)  # type: ignore[call-arg]
    router = calibrated_router(settings, default_roster(kb))
    assert router is not None and isinstance(router.embedder, StaticEmbedder)
    routed = await router.route(SALES_MESSAGE)
    assert routed is not None and routed.agent == "sales"
    assert SALES_MESSAGE not in embedder.texts
    [hit] = await kb.search(SALES_MESSAGE, collections=["catalogue"], k=1)
    assert hit.similarity is not None
    assert embedder.texts.count(SALES_MESSAGE) == 1
