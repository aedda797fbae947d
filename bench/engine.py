"""Benchmark of the handoff engine: what `Conversations.handle()` costs on top of the LLM, how many turns a
second one process gets through, and how many LLM calls and prompt tokens conversations use.

Everything is real except the LLM: Postgres (the embedded Postgres, or the server in BENCH_DATABASE_URL) with
a fresh database built by the migrations, the real `OpenAIChatModel` over HTTP, and the in-process
`FakeOpenAI` answering at once with `bench.conversations.policy`, a deterministic stand-in for the model.

Figures
    overhead     wall time of handle() minus the LLM's own time (the sum of llm_calls.latency_ms of that
                 message, i.e. the client's HTTP calls), sequentially and with 50 conversations at once
    throughput   customer messages (turns) per second, sequentially and with 50 conversations at once
    cost         LLM calls and prompt tokens per customer message over the scripted conversations, the tool
                 schemas' share of each call, and the prompt tokens a provider's prompt cache would serve
                 (the fake LLM plays one: what a prompt shares from its start with a recent one)
    growth       prompt tokens along one 50-message conversation, which the running summary (agents.summary,
                 HISTORY_TOKENS at its default) should bound: per call at messages 10 and 50 and their ratio,
                 and the summary calls made
    llm_client   (side figure) one LLM call through the openai SDK vs a plain HTTP POST, and the time spent
                 rebuilding tool schemas per call: CPU that the overhead figure counts as "LLM time"

Under 50-way concurrency the process is CPU-bound (see its CPU line): the wall times then mostly measure
waiting for the one event loop, and "LLM time" includes that waiting too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
from sqlalchemy import event, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.conversations import Conversations, MessageResult
from agents.db import models as m
from agents.db.engine import make_engine, make_sessions
from agents.identity import Author
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.static import StaticEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.loop import LoopConfig
from agents.model import OpenAIChatModel
from agents.router import MIN_SCORE, Router
from agents.summary import AGENT as SUMMARY_AGENT
from agents.summary import Summarising
from bench.conversations import GROWTH_CUSTOMER, LOAD_CYCLE, SCRIPTS, growth_messages, policy, writer
from bench.setup import DATABASE, DATABASE_PREFIX, RESULTS, quiet, section, summary, table, write_report
from bench.setup import machine as base_machine
from bot.runtime.startup import ensure_sample_knowledge
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, reply
from harness.database import DriverLog, admin, postgres_server, throwaway_database
from harness.sample import default_roster

TABLES = "conversations, inbound, messages, handoffs, tool_runs, llm_calls, escalations, refunds"
GROWTH_SAMPLES = (1, 5, 10, 20, 30, 40, 50)

Sessions = async_sessionmaker[AsyncSession]


@dataclass(frozen=True)
class Params:
    quick: bool
    warmup_turns: int
    sequential_conversations: int
    concurrent_conversations: int
    messages_per_conversation: int
    growth_messages: int
    client_repeats: int
    pool_size: int = 60

    @classmethod
    def of(cls, quick: bool) -> Params:
        if quick:
            return cls(
                quick=True,
                warmup_turns=12,
                sequential_conversations=10,
                concurrent_conversations=50,
                messages_per_conversation=2,
                growth_messages=50,
                client_repeats=20,
            )
        return cls(
            quick=False,
            warmup_turns=20,
            sequential_conversations=50,
            concurrent_conversations=50,
            messages_per_conversation=len(LOAD_CYCLE),
            growth_messages=50,
            client_repeats=100,
        )

    @property
    def sequential_turns(self) -> int:
        return self.sequential_conversations * len(LOAD_CYCLE)

    @property
    def concurrent_turns(self) -> int:
        return self.concurrent_conversations * self.messages_per_conversation


# ------------------------------------------------------------------------------------------------ set-up


@dataclass
class Counters:
    """Database work seen by the engine's connection pool, to put the overhead in terms of round trips."""

    statements: int = 0
    """Through SQLAlchemy; `driver` logs the rest (the hot path's, on the driver's own connection)."""
    checkouts: int = 0
    """Connections taken from the pool (make_engine does not pre-ping them)."""
    commits: int = 0
    """Transactions committed: SQLAlchemy's, and those on the driver's connection (`driver`)."""
    driver: DriverLog | None = None

    async def snapshot(self) -> tuple[int, int, int]:
        lone, ended = 0, 0
        if self.driver is not None:
            await self.driver.settled()
            kinds = self.driver.kinds
            ended = kinds["COMMIT"]
            lone = sum(kinds.values()) - kinds["BEGIN"] - ended - kinds["ROLLBACK"]
        return self.statements + lone, self.checkouts, self.commits + ended


@dataclass
class Bench:
    service: Conversations
    sessions: Sessions
    engine: AsyncEngine
    fake: FakeOpenAI
    model: OpenAIChatModel
    config: LoopConfig
    counters: Counters
    knowledge: KnowledgeBase
    """The sample store's knowledge (as `make run` starts with it), for the cost figure's grounded set-ups."""


@asynccontextmanager
async def bench_environment(server_url: str, params: Params) -> AsyncIterator[Bench]:
    async with throwaway_database(server_url, DATABASE_PREFIX) as url:
        engine = make_engine(url, pool_size=params.pool_size)
        with DriverLog(engine) as driver:
            counters = Counters(driver=driver)
            _count(engine, counters)
            async with FakeOpenAI() as fake:
                fake.rule = policy
                model = OpenAIChatModel(api_key="bench", base_url=fake.base_url, timeout_s=30.0, max_retries=0)
                config = LoopConfig(default_model="fake-model")
                sessions = make_sessions(engine)
                service = Conversations(
                    takeover=TAKEOVER,
                    sessions=sessions,
                    roster=default_roster(),
                    model=model,
                    config=config,
                    summarising=Summarising(model="fake-model"),
                )
                knowledge = KnowledgeBase(sessions=sessions, embedder=LocalEmbedder())
                await ensure_sample_knowledge(knowledge)
                try:
                    yield Bench(service, sessions, engine, fake, model, config, counters, knowledge)
                finally:
                    await model.close()
                    await engine.dispose()


def _count(engine: AsyncEngine, counters: Counters) -> None:
    def statement(*_: Any) -> None:
        counters.statements += 1

    def checkout(*_: Any) -> None:
        counters.checkouts += 1

    def commit(*_: Any) -> None:
        counters.commits += 1

    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    event.listen(engine.sync_engine, "checkout", checkout)
    event.listen(engine.sync_engine, "commit", commit)


async def reset(bench: Bench) -> None:
    """Empty every table between sections, so each starts from the same state (refunds are one per order)."""
    async with bench.engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    bench.fake.requests.clear()


# ------------------------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Sample:
    inbound_id: int
    wall_ms: float
    """submit() and the turn"""
    turn_ms: float
    """The turn alone: from the stored message to its committed result."""
    submit_work: tuple[int, int, int]
    turn_work: tuple[int, int, int]
    """Statements, checkouts and commits seen meanwhile: the message's own only when nothing else runs."""
    result: MessageResult


@dataclass(frozen=True)
class LLMUse:
    calls: int
    latency_ms: float
    prompt_tokens: int


async def timed(
    bench: Bench, key: str, message: str, author: Author | None = None, service: Conversations | None = None
) -> Sample:
    """Store the message, then run its turn, as a worker would."""
    service = service or bench.service
    started, before = time.perf_counter(), await bench.counters.snapshot()
    submitted = await service.submit(key, message, author=author)
    stored, between = time.perf_counter(), await bench.counters.snapshot()
    result = await service.process_next(submitted.conversation_id)
    done, after = time.perf_counter(), await bench.counters.snapshot()
    assert result is not None and result.inbound_id == submitted.inbound_id
    return Sample(
        submitted.inbound_id,
        (done - started) * 1000,
        (done - stored) * 1000,
        _minus(between, before),
        _minus(after, between),
        result,
    )


def _minus(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return a[0] - b[0], a[1] - b[1], a[2] - b[2]


async def llm_use(sessions: Sessions, inbound_ids: Sequence[int]) -> dict[int, LLMUse]:
    async with sessions() as s:
        rows = await s.execute(
            select(
                m.LLMCall.inbound_id,
                func.count(),
                func.coalesce(func.sum(m.LLMCall.latency_ms), 0.0),
                func.coalesce(func.sum(m.LLMCall.prompt_tokens), 0),
            )
            .where(m.LLMCall.inbound_id.in_(list(inbound_ids)))
            .group_by(m.LLMCall.inbound_id)
        )
        found = {
            inbound_id: LLMUse(int(calls), float(latency), int(tokens))
            for inbound_id, calls, latency, tokens in rows
            if inbound_id is not None
        }
    return {i: found.get(i, LLMUse(0, 0.0, 0)) for i in inbound_ids}


# ------------------------------------------------------------------------------------------------ figures


async def load_sequential(bench: Bench, params: Params) -> dict[str, Any]:
    """Figures 1 and 2a: the load cycle, one conversation at a time."""
    await reset(bench)
    for i in range(params.warmup_turns):
        await bench.service.handle(f"warm:{i // len(LOAD_CYCLE)}", LOAD_CYCLE[i % len(LOAD_CYCLE)])
    before = await bench.counters.snapshot()
    samples: list[Sample] = []
    started, cpu = time.perf_counter(), time.process_time()
    for c in range(params.sequential_conversations):
        for message in LOAD_CYCLE:
            samples.append(await timed(bench, f"seq:{c}", message))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    work = [after - prior for after, prior in zip(await bench.counters.snapshot(), before, strict=True)]
    return await _load_figures(bench, samples, elapsed, cpu, work)


async def load_concurrent(bench: Bench, params: Params) -> dict[str, Any]:
    """Figure 2b: `concurrent_conversations` tasks, each sending its messages one after another."""
    await reset(bench)
    messages = [LOAD_CYCLE[i % len(LOAD_CYCLE)] for i in range(params.messages_per_conversation)]

    async def customer(c: int) -> list[Sample]:
        return [await timed(bench, f"conc:{c}", message) for message in messages]

    before = await bench.counters.snapshot()
    started, cpu = time.perf_counter(), time.process_time()
    per_task = await asyncio.gather(*(customer(c) for c in range(params.concurrent_conversations)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    work = [after - prior for after, prior in zip(await bench.counters.snapshot(), before, strict=True)]
    return await _load_figures(bench, [s for task in per_task for s in task], elapsed, cpu, work)


async def _load_figures(
    bench: Bench, samples: list[Sample], elapsed: float, cpu: float, work: list[int]
) -> dict[str, Any]:
    use = await llm_use(bench.sessions, [s.inbound_id for s in samples])
    overhead = [s.wall_ms - use[s.inbound_id].latency_ms for s in samples]
    turn_overhead = [s.turn_ms - use[s.inbound_id].latency_ms for s in samples]
    llm = [use[s.inbound_id].latency_ms for s in samples]
    turns = len(samples)
    unexpected = sum(1 for s in samples if s.result.kind != "reply" or len(s.result.handoffs) != 1)
    return {
        "turns": turns,
        "elapsed_s": round(elapsed, 3),
        "turns_per_s": round(turns / elapsed, 1),
        "llm_calls_per_turn": round(sum(use[s.inbound_id].calls for s in samples) / turns, 2),
        "process_cpu_ms_per_turn": round(cpu * 1000 / turns, 2),
        "process_cpu_utilisation": round(cpu / elapsed, 2),
        "wall_ms": summary([s.wall_ms for s in samples]),
        "llm_ms": summary(llm),
        "overhead_ms": summary(overhead),
        "turn_overhead_ms": summary(turn_overhead),
        "db_per_phase": {
            phase: dict(
                zip(
                    ("statements", "connection_checkouts", "commits"),
                    (round(sum(getattr(s, phase)[i] for s in samples) / turns, 1) for i in range(3)),
                    strict=True,
                )
            )
            for phase in ("submit_work", "turn_work")
        },
        "db_per_turn": {
            "statements": round(work[0] / turns, 1),
            "connection_checkouts": round(work[1] / turns, 1),
            "commits": round(work[2] / turns, 1),
        },
        "turns_not_handoff_plus_reply": unexpected,
    }


@dataclass(frozen=True)
class Setup:
    """One way of running the scripted conversations; the cost figure compares them in one run."""

    name: str
    about: str
    grounded: bool
    """Sales and support search the sample store's knowledge (as `make run` ships them)."""
    config: LoopConfig
    routed: bool = False
    """The router (agents.router, at its calibrated threshold) may route a message without a call."""


COST_SETUPS = (
    Setup(
        "before",
        "the engine before issue 16's calls work, on the roster the issue measured (no knowledge base): the model "
        "routes, looks up and searches with tool calls",
        False,
        LoopConfig(default_model="fake-model", retrieval_tokens=0, prefetch=False),
    ),
    Setup(
        "before, grounded",
        "the same engine with the sample knowledge, as `make run` starts: the model searches before answering",
        True,
        LoopConfig(default_model="fake-model", retrieval_tokens=0, prefetch=False),
    ),
    Setup(
        "now",
        "with the sample knowledge: the router sends a message to its specialist without a call when it is sure, "
        "and the passages for the message and the look-ups it names are at hand before the first call",
        True,
        LoopConfig(default_model="fake-model"),
        routed=True,
    ),
)
CITED = re.compile(r"\[\d+\]")


def setup_service(bench: Bench, setup: Setup) -> Conversations:
    roster = default_roster(bench.knowledge) if setup.grounded else default_roster()
    examples = {name: agent.examples for name, agent in roster.agents.items()}
    # As the bot wires it (`bot.runtime.calibrated_router`): the static table, its threshold calibrated for it.
    router = Router(StaticEmbedder(), examples, min_score=MIN_SCORE) if setup.routed else None
    return Conversations(
        takeover=TAKEOVER, sessions=bench.sessions, roster=roster, model=bench.model, config=setup.config, router=router
    )


async def cost(bench: Bench) -> dict[str, Any]:
    """Figure 3: the scripted conversations, one after another, in each set-up; the goals compare them."""
    figures = {setup.name: await cost_of(bench, setup) | {"about": setup.about} for setup in COST_SETUPS}
    before, grounded, now = (figures[s.name] for s in COST_SETUPS)
    return {
        "setups": figures,
        "now_vs_before": {
            "llm_calls_per_message": (before["llm_calls_per_message"], now["llm_calls_per_message"]),
            "prompt_tokens_ratio": round(now["prompt_tokens_per_message"] / before["prompt_tokens_per_message"], 3),
            "prompt_tokens_ratio_grounded": round(
                now["prompt_tokens_per_message"] / grounded["prompt_tokens_per_message"], 3
            ),
            "cited_replies": (grounded["cited_replies"], now["cited_replies"]),
            "mismatches": now["mismatches"],
        },
    }


async def cost_of(bench: Bench, setup: Setup) -> dict[str, Any]:
    await reset(bench)
    service = setup_service(bench, setup)
    bench.fake.prompt_cache = True
    conversations: list[dict[str, Any]] = []
    for script in SCRIPTS:
        samples = [
            await timed(bench, f"cost:{script.name}", say.text, script.author, service) for say in script.messages
        ]
        use = await llm_use(bench.sessions, [s.inbound_id for s in samples])
        async with bench.sessions() as s:
            tool_calls = await s.scalar(
                select(func.count())
                .select_from(m.ToolRun)
                .where(
                    m.ToolRun.inbound_id.in_([x.inbound_id for x in samples]),
                    m.ToolRun.tool.not_like("transfer_to_%"),
                )
            )
            routed = await s.scalar(
                select(func.count())
                .select_from(m.Handoff)
                .where(m.Handoff.inbound_id.in_([x.inbound_id for x in samples]), m.Handoff.reason.like("router %"))
            )
        mismatches = [
            f"message {i}: expected {say.agent}/{say.kind}, got {sample.result.agent}/{sample.result.kind}"
            for i, (say, sample) in enumerate(zip(script.messages, samples, strict=True), 1)
            if (say.agent, say.kind) != (sample.result.agent, sample.result.kind)
        ]
        calls = [use[x.inbound_id].calls for x in samples]
        tokens = [use[x.inbound_id].prompt_tokens for x in samples]
        conversations.append(
            {
                "name": script.name,
                "about": script.about,
                "messages": len(samples),
                "llm_calls": sum(calls),
                "prompt_tokens": sum(tokens),
                "handoffs": sum(len(x.result.handoffs) for x in samples),
                "routed_without_a_call": int(routed or 0),
                "tool_calls": int(tool_calls or 0),
                "llm_calls_per_message": round(sum(calls) / len(samples), 2),
                "prompt_tokens_per_message": round(sum(tokens) / len(samples), 1),
                "per_message": [
                    {
                        "text": say.text,
                        "agent": x.result.agent,
                        "kind": x.result.kind,
                        "llm_calls": c,
                        "prompt_tokens": t,
                        "handoffs": [f"{h.from_agent}->{h.to_agent}" for h in x.result.handoffs],
                        "cited": bool(CITED.search(x.result.reply or "")),
                    }
                    for say, x, c, t in zip(script.messages, samples, calls, tokens, strict=True)
                ],
                "mismatches": mismatches,
            }
        )
    bench.fake.prompt_cache = False
    messages = sum(c["messages"] for c in conversations)
    calls_total = sum(c["llm_calls"] for c in conversations)
    tokens_total = sum(c["prompt_tokens"] for c in conversations)
    # Counted as the fake LLM counts prompt tokens (4 characters of JSON a token), so the share is comparable.
    schema_tokens = [-(-len(json.dumps(r.tools)) // 4) for r in bench.fake.requests if r.tools]
    async with bench.sessions() as s:
        cached_total = int(await s.scalar(select(func.coalesce(func.sum(m.LLMCall.cached_tokens), 0))) or 0)
    return {
        "conversations": len(conversations),
        "customer_messages": messages,
        "llm_calls": calls_total,
        "prompt_tokens": tokens_total,
        "handoffs": sum(c["handoffs"] for c in conversations),
        "routed_without_a_call": sum(c["routed_without_a_call"] for c in conversations),
        "tool_calls": sum(c["tool_calls"] for c in conversations),
        "llm_calls_per_message": round(calls_total / messages, 2),
        "prompt_tokens_per_message": round(tokens_total / messages, 1),
        "prompt_tokens_per_call": round(tokens_total / calls_total, 1),
        "tool_schema_tokens_per_call": round(sum(schema_tokens) / max(len(schema_tokens), 1), 1),
        "cached_prompt_tokens_per_message": round(cached_total / messages, 1),
        "cached_share": round(cached_total / tokens_total, 3) if tokens_total else 0.0,
        "cited_replies": sum(1 for c in conversations for x in c["per_message"] if x["cited"]),
        "mismatches": sum(len(c["mismatches"]) for c in conversations),
        "per_conversation": conversations,
    }


async def growth(bench: Bench, params: Params) -> dict[str, Any]:
    """Figure 4: one long conversation; the prompt of every call, and how much of the transcript it carried."""
    await reset(bench)
    texts = growth_messages(params.growth_messages)
    author = writer("growth", GROWTH_CUSTOMER)
    rows: list[dict[str, Any]] = []
    stored = 0
    summaries = bench.service.summaries
    for n, message in enumerate(texts, 1):
        first_request = len(bench.fake.requests)
        result = await bench.service.handle("growth", message, author=author)
        requests = bench.fake.requests[first_request:]
        if summaries is not None:
            await summaries.settled()  # made after the reply; settled here so that each message's figure is its own
        async with bench.sessions() as s:
            tokens = list(
                await s.scalars(
                    select(m.LLMCall.prompt_tokens)
                    .where(m.LLMCall.inbound_id == result.inbound_id, m.LLMCall.agent != SUMMARY_AGENT)
                    .order_by(m.LLMCall.id)
                )
            )
        in_window = sum(1 for msg in requests[0].messages if msg.get("role") != "system") if requests else 0
        rows.append(
            {
                "message": n,
                "chars": len(message),
                "agent": result.agent,
                "llm_calls": len(tokens),
                "first_call_prompt_tokens": tokens[0] if tokens else 0,
                "max_call_prompt_tokens": max(tokens, default=0),
                "prompt_tokens_per_call": round(sum(tokens) / len(tokens)) if tokens else 0,
                "window_messages": in_window,
                "transcript_messages": stored + 1,
                "trimmed": in_window < stored + 1,
            }
        )
        async with bench.sessions() as s:
            stored = int(
                await s.scalar(
                    select(func.count())
                    .select_from(m.Message)
                    .where(m.Message.conversation_id == result.conversation_id)
                )
                or 0
            )
    first_trimmed = next((r["message"] for r in rows if r["trimmed"]), None)
    async with bench.sessions() as s:
        made = (
            await s.execute(
                select(
                    func.count(), func.count().filter(m.LLMCall.ok), func.coalesce(func.sum(m.LLMCall.prompt_tokens), 0)
                ).where(m.LLMCall.conversation_id == result.conversation_id, m.LLMCall.agent == SUMMARY_AGENT)
            )
        ).one()
    per_call = {r["message"]: r["prompt_tokens_per_call"] for r in rows}
    at_10, at_50 = per_call.get(10, 0), per_call.get(50, 0)
    return {
        "prompt_tokens_per_call_at_10": at_10,
        "prompt_tokens_per_call_at_50": at_50,
        "ratio_50_to_10": round(at_50 / at_10, 2) if at_10 else None,
        "summary_calls": int(made[0]),
        "summary_calls_ok": int(made[1]),
        "summary_prompt_tokens": int(made[2]),
        "token_budget": bench.config.token_budget,
        "messages": len(rows),
        "message_chars": {"min": min(r["chars"] for r in rows), "max": max(r["chars"] for r in rows)},
        "first_message_with_trimmed_window": first_trimmed,
        "max_prompt_tokens": max(r["max_call_prompt_tokens"] for r in rows),
        "samples": [r for r in rows if r["message"] in GROWTH_SAMPLES],
        "all": rows,
    }


async def client_cost(bench: Bench, params: Params) -> dict[str, Any]:
    """Side figure: what one LLM call costs this process before any network latency. The same request sent
    through OpenAIChatModel (the openai SDK) and as a plain aiohttp POST, at several history lengths; and the
    time the loop spends rebuilding the tool schemas it sends with every call."""
    roster = bench.service.roster
    schemas = [t.schema() for t in roster.tools_of("support")]
    system = {"role": "system", "content": roster["support"].render_instructions({})}
    saved, bench.fake.rule = bench.fake.rule, lambda _: reply("Thanks, noted. " * 20)
    rows: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as http:
            for size in (2, 20, 100):
                turns = [
                    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: " + "lorem ipsum " * 30}
                    for i in range(size)
                ]
                messages = [system, *turns]
                body = {"model": "fake-model", "messages": messages, "tools": schemas}

                async def sdk(messages: list[dict[str, Any]] = messages) -> None:
                    await bench.model.complete(model="fake-model", messages=messages, tools=schemas)

                async def raw(body: dict[str, Any] = body) -> None:
                    async with http.post(f"{bench.fake.base_url}/chat/completions", json=body) as response:
                        await response.json()

                rows.append(
                    {
                        "history_messages": size,
                        "request_kb": round(len(json.dumps(body)) / 1024, 1),
                        "sdk_ms": round(await _mean_ms(sdk, params.client_repeats), 2),
                        "raw_http_ms": round(await _mean_ms(raw, params.client_repeats), 2),
                    }
                )
    finally:
        bench.fake.rule = saved
        bench.fake.requests.clear()
    repeats = params.client_repeats * 5
    schema_ms = {}
    for name in roster.agents:
        started = time.perf_counter()
        for _ in range(repeats):
            [t.schema() for t in roster.tools_of(name)]
        schema_ms[name] = round((time.perf_counter() - started) * 1000 / repeats, 3)
    return {"llm_call": rows, "tool_schemas_ms_per_call": schema_ms}


async def _mean_ms(call: Callable[[], Awaitable[None]], repeats: int) -> float:
    for _ in range(3):
        await call()
    started = time.perf_counter()
    for _ in range(repeats):
        await call()
    return (time.perf_counter() - started) * 1000 / repeats


# ------------------------------------------------------------------------------------------------ report


def print_client(figures: dict[str, Any]) -> None:
    section("One LLM call against a zero-latency server: the openai SDK vs a plain HTTP POST (mean ms)")
    print(
        table(
            ("history messages", "request KB", "OpenAIChatModel", "plain aiohttp POST"),
            [(r["history_messages"], r["request_kb"], r["sdk_ms"], r["raw_http_ms"]) for r in figures["llm_call"]],
        )
    )
    schemas = ", ".join(f"{name} {ms:.2f} ms" for name, ms in figures["tool_schemas_ms_per_call"].items())
    print(f"rebuilding the tool schemas, done before every LLM call: {schemas}")


def print_load(title: str, figures: dict[str, Any]) -> None:
    section(title)
    print(
        f"{figures['turns']} turns in {figures['elapsed_s']:.2f} s = {figures['turns_per_s']} turns/s; "
        f"{figures['llm_calls_per_turn']} LLM calls per turn"
    )
    print(
        table(
            ("per turn, ms", "p50", "p90", "p99", "mean", "max"),
            [
                (label, *(figures[key][k] for k in ("p50", "p90", "p99", "mean", "max")))
                for label, key in (
                    ("wall time: store, then the turn", "wall_ms"),
                    ("LLM time (client-measured)", "llm_ms"),
                    ("engine overhead (store + turn)", "overhead_ms"),
                    ("turn overhead (the turn alone)", "turn_overhead_ms"),
                )
            ],
        )
    )
    db = figures["db_per_turn"]
    phases = figures["db_per_phase"]
    print(
        f"CPU of this process (engine, SDK and fake LLM): {figures['process_cpu_ms_per_turn']} ms per turn, "
        f"{figures['process_cpu_utilisation']:.0%} of one core"
    )
    print(
        f"database per message: {db['statements']} statements, {db['connection_checkouts']} connection checkouts, "
        f"{db['commits']} commits"
    )
    mixed = " (mixed with other tasks' under concurrency)" if "Concurrent" in title else ""
    for label, phase in (("storing the message", "submit_work"), ("the turn", "turn_work")):
        work = phases[phase]
        print(
            f"  {label}: {work['statements']} statements, {work['connection_checkouts']} checkouts, "
            f"{work['commits']} commits{mixed}"
        )
    if figures["turns_not_handoff_plus_reply"]:
        print(f"WARNING: {figures['turns_not_handoff_plus_reply']} turns were not one handoff plus a reply")


def print_cost(figures: dict[str, Any]) -> None:
    for name, setup in figures["setups"].items():
        print_setup(name, setup)
    goals = figures["now_vs_before"]
    section("LLM cost: now against before, in this run")
    calls_before, calls_now = goals["llm_calls_per_message"]
    cited_before, cited_now = goals["cited_replies"]
    print(
        f"LLM calls per message {calls_before} -> {calls_now} (goal <= 1.3); prompt tokens per message x"
        f"{goals['prompt_tokens_ratio_grounded']} of before, grounded (goal <= 0.6; x{goals['prompt_tokens_ratio']} "
        f"of before without a knowledge base); replies citing a source {cited_before} -> {cited_now}; wrong agent "
        f"or outcome: {goals['mismatches']}"
    )


def print_setup(name: str, figures: dict[str, Any]) -> None:
    section(f"LLM cost over the scripted conversations: {name}")
    print(figures["about"])
    rows: list[Sequence[object]] = [
        (
            c["name"],
            c["messages"],
            c["llm_calls"],
            c["handoffs"],
            c["tool_calls"],
            c["llm_calls_per_message"],
            c["prompt_tokens_per_message"],
            round(c["prompt_tokens"] / c["llm_calls"], 1) if c["llm_calls"] else 0.0,
        )
        for c in figures["per_conversation"]
    ]
    rows.append(
        (
            "all",
            figures["customer_messages"],
            figures["llm_calls"],
            figures["handoffs"],
            figures["tool_calls"],
            figures["llm_calls_per_message"],
            figures["prompt_tokens_per_message"],
            figures["prompt_tokens_per_call"],
        )
    )
    print(table(("conversation", "msgs", "calls", "handoffs", "tools", "calls/msg", "tokens/msg", "tokens/call"), rows))
    print(
        f"tool schemas: {figures['tool_schema_tokens_per_call']} tokens per call; prompt cache (played by the fake "
        f"LLM): {figures['cached_prompt_tokens_per_message']} tokens per message, {figures['cached_share']:.0%} of "
        f"prompt tokens; replies citing a source: {figures['cited_replies']}; handoffs routed without a call: "
        f"{figures['routed_without_a_call']}"
    )
    for c in figures["per_conversation"]:
        for problem in c["mismatches"]:
            print(f"WARNING: {c['name']}: {problem}")


def print_growth(figures: dict[str, Any]) -> None:
    section(f"Prompt growth over one {figures['messages']}-message conversation")
    chars = figures["message_chars"]
    print(
        f"token budget (LoopConfig.token_budget): {figures['token_budget']:,} estimated tokens; customer messages "
        f"{chars['min']}-{chars['max']} chars"
    )
    print(
        f"window first trimmed at message {figures['first_message_with_trimmed_window']}; "
        f"largest prompt of any call: {figures['max_prompt_tokens']:,} tokens"
    )
    print(
        f"prompt tokens per call: {figures['prompt_tokens_per_call_at_10']:,} at message 10, "
        f"{figures['prompt_tokens_per_call_at_50']:,} at message 50 (ratio {figures['ratio_50_to_10']}); "
        f"{figures['summary_calls']} summary calls ({figures['summary_calls_ok']} made, "
        f"{figures['summary_prompt_tokens']:,} prompt tokens)"
    )
    print(
        table(
            ("message", "calls", "prompt tokens (1st call)", "max call", "msgs in window", "msgs in transcript"),
            [
                (
                    r["message"],
                    r["llm_calls"],
                    r["first_call_prompt_tokens"],
                    r["max_call_prompt_tokens"],
                    r["window_messages"],
                    r["transcript_messages"],
                )
                for r in figures["samples"]
            ],
        )
    )


def machine(database: str, server_version: str | None) -> dict[str, Any]:
    return base_machine(database, server_version, openai=openai.__version__)


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, database: str, params: Params) -> dict[str, Any]:
    started = time.perf_counter()
    version = await admin(server_url, "SELECT current_setting('server_version')")
    async with bench_environment(server_url, params) as bench:
        print(f"set-up (database, migrations, fake LLM): {time.perf_counter() - started:.1f} s", flush=True)
        sequential = await load_sequential(bench, params)
        print_load(f"Sequential: one conversation at a time (after {params.warmup_turns} warm-up turns)", sequential)
        concurrent = await load_concurrent(bench, params)
        print_load(
            f"Concurrent: {params.concurrent_conversations} conversations at once, "
            f"{params.messages_per_conversation} messages each",
            concurrent,
        )
        cost_figures = await cost(bench)
        print_cost(cost_figures)
        growth_figures = await growth(bench, params)
        print_growth(growth_figures)
        client_figures = await client_cost(bench, params)
        print_client(client_figures)
    return {
        "benchmark": "engine",
        "machine": machine(database, version),
        "parameters": {
            **asdict(params),
            "sequential_turns": params.sequential_turns,
            "concurrent_turns": params.concurrent_turns,
            "token_budget": LoopConfig(default_model="fake-model").token_budget,
            "llm": "FakeOpenAI in-process, zero latency, answering with bench.conversations.policy",
        },
        "figures": {
            "sequential": sequential,
            "concurrent": concurrent,
            "cost": cost_figures,
            "growth": growth_figures,
            "llm_client": client_figures,
        },
        "total_s": round(time.perf_counter() - started, 1),
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the engine benchmark, print its tables and write `results/engine.json`."""
    quiet()
    params = Params.of(quick)
    print(f"engine benchmark{' (quick)' if quick else ''}: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    with postgres_server(DATABASE) as (server_url, database):
        report = asyncio.run(run(server_url, database, params))
    return write_report(report, results / "engine.json")
