"""`python -m bot chat`: talk to the engine in the terminal and watch agents, handoffs and tools work."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from agents.conversations import ResultKind
from agents.loop import Escalate, Event, HandoffRecord, Reply, ToolRecord, ToolStarted, TurnStarted
from bot.declaration.build import helpdesk, test_customer
from bot.runtime import startup as runtime
from bot.settings import Settings

OFFLINE = """Offline mode: no LLM provider is configured, so answers are the knowledge base's best passages.
For the agents themselves, set one of:
  OPENAI_API_KEY=sk-...                      (OpenAI; optionally OPENAI_MODEL, default gpt-4o-mini)
  OPENAI_BASE_URL=http://localhost:11434/v1  (any OpenAI-compatible server: Ollama, vLLM, LiteLLM, Azure)
in the environment or in .env (see .env.example)."""


def _style(code: str, text: str) -> str:
    return f"\033[{code}m{text}\033[0m" if sys.stdout.isatty() else text


async def _show(event: Event) -> None:
    match event:
        case ToolStarted(agent, call):
            print(_style("2", f"  [{agent}] calls {call.name}({call.arguments})"))
        case ToolRecord(agent, call, ok, output) if not ok:
            print(_style("31", f"  [{agent}] {call.name} failed: {output}"))
        case ToolRecord(agent, call, _, output):
            print(_style("2", f"  [{agent}] {call.name} -> {output[:200]}"))
        case HandoffRecord(src, dst, reason):
            print(_style("33", f"  handoff {src} -> {dst}" + (f" ({reason})" if reason else "")))
        case Escalate(reason, trigger):
            print(_style("35", f"  escalated to a human ({trigger}): {reason}"))
        case Reply() | TurnStarted():
            pass


async def chat(settings: Settings, *, conversation: str | None) -> int:
    key = f"cli:{conversation or uuid.uuid4().hex[:8]}"
    settings, declared = helpdesk(settings)
    # Whoever types writes as the declaration's test customer (the sample's owns orders that can be refunded).
    author = test_customer(declared.declaration, "cli")
    async with runtime.open_database(settings) as db:
        brain = await runtime.brain(settings, db, declared)
        if brain.offline:
            print(OFFLINE, file=sys.stderr)
        service = runtime.terminal_engine(settings, db, brain)
        print(f"Conversation {key!r} (resume it with --conversation {key[4:]}). Ctrl-D to quit.")
        person = declared.declaration.spec.test_customer
        note = f", {person.note}" if person is not None and person.note else ""
        print(f"You write as {author.name}" + (f" <{author.email}>" if author.email else "") + f"{note}.")
        state = await service.state(key)
        if state is not None:
            print(f"Resuming: {state.agent} is active, mode {state.mode}, context {json.dumps(state.context)}")
        while True:
            try:
                text = await asyncio.to_thread(input, _style("1", "you> "))
            except EOFError:
                print()
                break
            if not text.strip():
                continue
            result = await service.handle(key, text, author=author, on_event=_show)
            if result.kind == ResultKind.HUMAN:
                print(_style("35", "  (a human owns this conversation now; the bot stays quiet)"))
            elif result.reply:
                title = service.roster.get(result.agent).title
                print(f"{_style('36', title)}> {result.reply}")
        if service.summaries is not None:
            await service.summaries.settled()  # a summary under way is kept for the next --conversation
        await brain.close()
    return 0
