"""`python -m bench admin`: how fast `/support` acks and answers on a database with a realistic history.

A throwaway database is filled with synthetic history (conversations with messages, handoffs, LLM calls and
escalations spread over a year) by a few INSERT ... SELECT statements; then `python -m bot serve` runs as a
separate process against it, and every read-only subcommand is sent as a signed slash command by the Slack
emulator. Two figures per subcommand: the ack (the HTTP answer to the slash command) and the answer (until
the body arrives at the emulator's response_url)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.setup import DATABASE_PREFIX, RESULTS, run_benchmark, section, summary, table
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply
from harness.bot import bot_env, bot_process, emulator
from harness.database import throwaway_database

ADMIN = "U_ADMIN"
FIRST_THREAD = "1700000001.000100"
COMMANDS = (
    "help",
    "status",
    "agents",
    "conversations recent",
    "conversations human",
    f"show <https://driftwing.slack.com/archives/C_SUPPORT/p{FIRST_THREAD.replace('.', '')}>",
    "escalations",
    "kb stats",
    "kb search battery life of the kestrel",
    "stats 1",
    "stats 30",
    "stats 365",
)


@dataclass(frozen=True)
class Params:
    conversations: int
    repeats: int

    @classmethod
    def of(cls, quick: bool) -> Params:
        return cls(conversations=2_000, repeats=3) if quick else cls(conversations=50_000, repeats=15)


# Each conversation: 8 customer messages, 16 transcript rows, 3 LLM calls; two in three hand off once; one in
# ten escalated (claimed after 3 min, answered after 5); one in fifty still with a person. Spread over a year.
SEED = (
    """INSERT INTO conversations (key, mode, active_agent, created_at, updated_at)
    SELECT 'slack:T0001:C_SUPPORT:' || (1700000000 + g) || '.000100',
           CASE WHEN g % 50 = 0 THEN 'human' WHEN g % 3 = 0 THEN 'closed' ELSE 'bot' END,
           (ARRAY['triage', 'sales', 'support'])[g % 3 + 1],
           now() - (g::bigint * 525600 / :n) * interval '1 minute',
           now() - (g::bigint * 525600 / :n) * interval '1 minute'
    FROM generate_series(1, :n) g""",
    """INSERT INTO inbound (conversation_id, external_id, author, text, kind, received_at, processed_at, outcome)
    SELECT c.id, k::text, 'U_CUSTOMER', 'question ' || k, 'customer', c.created_at + k * interval '1 minute',
           c.created_at + k * interval '1 minute', '{}'::jsonb
    FROM conversations c, generate_series(1, 8) k""",
    """INSERT INTO messages (conversation_id, role, agent, content, created_at)
    SELECT c.id, CASE WHEN k % 2 = 1 THEN 'user' ELSE 'assistant' END, c.active_agent, 'message ' || k,
           c.created_at + k * interval '30 seconds'
    FROM conversations c, generate_series(1, 16) k""",
    """INSERT INTO handoffs (conversation_id, from_agent, to_agent, created_at)
    SELECT id, 'triage', active_agent, created_at FROM conversations WHERE active_agent <> 'triage'""",
    """INSERT INTO llm_calls (conversation_id, agent, model, ok, prompt_tokens, completion_tokens, latency_ms,
                              created_at)
    SELECT c.id, c.active_agent, 'fake-model', k <> 3 OR c.id % 97 <> 0, 2300, 80, 600, c.created_at
    FROM conversations c, generate_series(1, 3) k""",
    """INSERT INTO escalations (conversation_id, status, reason, trigger, agent, claimed_by, claimed_at,
                                first_response_at, closed_at, created_at)
    SELECT id, CASE WHEN mode = 'human' THEN 'claimed' ELSE 'resolved' END, 'customer asked for a person',
           'agent', active_agent, 'U_STAFF', created_at + interval '3 minutes', created_at + interval '5 minutes',
           CASE WHEN mode = 'human' THEN NULL ELSE created_at + interval '1 hour' END, created_at
    FROM conversations WHERE id % 10 = 0 OR mode = 'human'""",
    "ANALYZE",
)


async def seed(url: str, conversations: int) -> dict[str, Any]:
    engine = create_async_engine(url, poolclass=NullPool)
    started = time.perf_counter()
    try:
        async with engine.begin() as conn:
            for statement in SEED[:-1]:
                await conn.execute(text(statement), {"n": conversations} if ":n" in statement else {})
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(SEED[-1]))
            counts: dict[str, int] = {}
            for table_name in ("conversations", "inbound", "messages", "handoffs", "llm_calls", "escalations"):
                counts[table_name] = int(await conn.scalar(text(f"SELECT count(*) FROM {table_name}")) or 0)
    finally:
        await engine.dispose()
    return {"rows": counts, "seconds": round(time.perf_counter() - started, 1)}


async def time_command(emulator: SlackEmulator, command: str) -> tuple[float, float, int]:
    """(ack ms, answer ms, answer size in bytes) of one `/support` command."""
    before = len(emulator.response_log)
    started = time.monotonic()
    ack = await emulator.slash_command("/support", command, user=ADMIN, channel="C_STAFF")
    acked = time.monotonic()
    if ack.status != 200:
        raise RuntimeError(f"/support {command}: HTTP {ack.status} {ack.body}")
    answers = await emulator.wait_for(lambda: emulator.response_log[before:], timeout=60)
    answered = answers[0].at  # when the emulator received it, not when wait_for next looked
    body = answers[0].body
    if "went wrong" in json.dumps(body):
        raise RuntimeError(f"/support {command} failed: {body}")
    return (acked - started) * 1000, (answered - started) * 1000, len(json.dumps(body))


async def run(server_url: str, params: Params) -> dict[str, Any]:
    async with throwaway_database(server_url, DATABASE_PREFIX) as url, FakeOpenAI() as fake, emulator() as slack:
        fake.rule = lambda request: reply(f"re: {request.last_user}")
        slack.add_user(ADMIN, "ada", "Ada Admin")
        section(f"seeding {params.conversations:,} conversations")
        seeded = await seed(url, params.conversations)
        print(", ".join(f"{k} {v:,}" for k, v in seeded["rows"].items()) + f" in {seeded['seconds']} s", flush=True)
        env = bot_env(url, fake, slack, max_concurrent_turns=2, db_pool_size=10, admin_user_ids=ADMIN)
        async with bot_process(env, slack) as bot:
            for command in COMMANDS:  # warm-up: imports, connections, plans
                await time_command(slack, command)
            samples: dict[str, list[tuple[float, float, int]]] = {c: [] for c in COMMANDS}
            for _ in range(params.repeats):
                for command in COMMANDS:
                    samples[command].append(await time_command(slack, command))
            bot.check_alive()
    figures: dict[str, dict[str, Any]] = {
        command.split(" <")[0]: {
            "ack_ms": summary([s[0] for s in runs]),
            "answer_ms": summary([s[1] for s in runs]),
            "answer_bytes": runs[-1][2],
        }
        for command, runs in samples.items()
    }
    section(f"/support over HTTP, {params.repeats} runs each (ms)")
    rows = [
        (name, f["ack_ms"]["p50"], f["ack_ms"]["max"], f["answer_ms"]["p50"], f["answer_ms"]["p90"], f["answer_bytes"])
        for name, f in figures.items()
    ]
    print(table(("subcommand", "ack p50", "ack max", "answer p50", "answer p90", "bytes"), rows))
    return {
        "parameters": asdict(params) | {"history": "synthetic, spread over 365 days: see SEED in bench/admin.py"},
        "seeded": seeded,
        "figures": figures,
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the admin benchmark, print its figures and write `results/admin.json`."""
    params = Params.of(quick)
    return run_benchmark("admin", quick, results, lambda url: run(url, params))
