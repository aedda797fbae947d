"""The run loop: one customer message in, one turn out.

Ask the active agent's model; if it answered in words, that is the reply; if it called tools, run them
(concurrently, bounded) and ask again; a tool that returns `HandoffTo` switches the active agent within the
same turn, one that returns `EscalateTo` ends the turn in the hands of a human. Each model response becomes
one `TurnOutcome` (Reply | Handoff | Escalate | RunAgain) and the loop branches on it. Inputs are never
mutated: the result is a new value that the caller persists in one transaction.

Policy when one response holds several transfers: an escalation wins; otherwise the first valid transfer is
taken; every other transfer is answered with an error message saying why it was not performed. Budgets
(LLM calls, handoffs, and ping-pong: returning to an agent already active in this turn) end the turn with an
honest message and an escalation, never with an exception.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.agent import Agent, Roster
from agents.db.deliveries import MAX_SOURCES, Source
from agents.errors import ProviderError, ToolUnavailable
from agents.identity import Author
from agents.language import Language
from agents.messages import PREPARED, Message, ToolCall
from agents.model import Model, ModelResponse, Usage
from agents.router import Routed, Router, acts_on
from agents.texts import Text, Texts
from agents.tools import Cited, EscalateTo, HandoffTo, Tool, ToolArgumentsError, ToolContext
from agents.window import build_window, shared, speaks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopConfig:
    default_model: str
    max_llm_calls: int = 8
    max_handoffs: int = 3
    max_parallel_tools: int = 4
    token_budget: int = 12_000
    tool_timeout_s: float = 30.0
    retrieval_tokens: int = 250
    """Budget for the passages an agent with a knowledge base is given before its first call (`Agent.retrieve`);
    0 turns that retrieval off, leaving the search to the model."""
    prefetch: bool = True
    """Run the look-ups the customer's message calls for (`Agent.prefetch`) before the agent's first call; off,
    the model calls them itself."""
    texts: Texts = field(default_factory=Texts)
    """What the customer is told when the turn ends without an agent's own words, in their language."""
    stream: bool = True
    """Ask the model to stream when someone listens to the turn's events: its words arrive as `TextDelta`s while it
    writes (a preview the channel may show); the committed answer is the same either way."""


@dataclass(frozen=True)
class TurnInput:
    conversation_id: int
    inbound_id: int | None
    agent: str
    context: Mapping[str, Any]
    history: tuple[Message, ...]
    """The transcript the model may see, ending with the customer's new message."""
    asker: Author | None = None
    """Who wrote that message, as the platform verified it: the tools' `ToolContext.asker`."""
    summary: str | None = None
    """The running summary of the turns before `history` (agents.summary), or None."""
    language: Language | None = None
    """The conversation's language as far as it is known (told from the customer's words or their locale): the
    agents are asked to answer in it, and the engine's own words are in it. None: the operator's default."""


Trigger = Literal["agent", "budget", "ping_pong", "provider", "error", "paused", "colleague", "no_answer"]


# The closed set of things one model response can come to.
@dataclass(frozen=True)
class Reply:
    text: str


@dataclass(frozen=True)
class Handoff:
    target: str
    reason: str | None


@dataclass(frozen=True)
class Escalate:
    reason: str
    trigger: Trigger
    """Why the turn ended with a human."""


@dataclass(frozen=True)
class RunAgain:
    pass


TurnOutcome = Reply | Handoff | Escalate | RunAgain


@dataclass(frozen=True)
class HandoffRecord:
    from_agent: str
    to_agent: str
    reason: str | None


@dataclass(frozen=True)
class TurnStarted:
    """An agent began working on the customer's message (before its first model call)."""

    agent: str
    asker: Author | None = None
    """Who wrote the message, as the platform vouched (a channel streams the answer to them)."""
    language: Language | None = None
    """The conversation's language (None: the operator's default), for the words a channel adds (handoff notices)."""


@dataclass(frozen=True)
class TextDelta:
    """Words of a model call as they arrive: a preview. `call` numbers the turn's model calls, so that text a call
    wrote before asking for tools can be told from the next call's. The answer of record is the turn's `Reply`."""

    agent: str
    text: str
    call: int


@dataclass(frozen=True)
class ToolStarted:
    agent: str
    call: ToolCall


@dataclass(frozen=True)
class ToolRecord:
    agent: str
    call: ToolCall
    ok: bool
    output: str
    """What the model sees as the result; an error message when not ok."""
    duration_ms: float
    result: HandoffTo | EscalateTo | None = None
    source: str = "python"
    """Where the tool ran (`Tool.source`): "python", "http", "mcp:<server>"; "unknown" for a name no tool has."""
    sources: tuple[Source, ...] = ()
    """The knowledge its output showed the model (`Cited`)."""


@dataclass(frozen=True)
class LLMCallRecord:
    agent: str
    model: str
    ok: bool
    error: str | None
    usage: Usage
    latency_ms: float


@dataclass(frozen=True)
class TurnResult:
    agent: str
    """The active agent after the turn: the one that answers the next message."""
    context: dict[str, Any]
    messages: tuple[Message, ...]
    """Everything the turn added to the transcript after the customer's message."""
    outcome: Reply | Escalate
    reply: str
    """The text the customer is shown."""
    handoffs: tuple[HandoffRecord, ...]
    tools: tuple[ToolRecord, ...]
    llm_calls: tuple[LLMCallRecord, ...]
    sources: tuple[Source, ...] = ()
    """What a `Reply` was grounded in: the knowledge the answering agent was given this turn (`grounding`)."""


Event = TurnStarted | TextDelta | ToolStarted | ToolRecord | HandoffRecord | Reply | Escalate
EventSink = Callable[[Event], Awaitable[None]]


async def run_turn(
    turn: TurnInput,
    *,
    roster: Roster,
    model: Model,
    config: LoopConfig,
    db: async_sessionmaker[AsyncSession] | None = None,
    on_event: EventSink | None = None,
    router: Router | None = None,
) -> TurnResult:
    agent = roster.get(turn.agent)
    context = dict(turn.context)
    new: list[Message] = []
    handoffs: list[HandoffRecord] = []
    tools: list[ToolRecord] = []
    calls: list[LLMCallRecord] = []
    asked = 0  # model calls made; `calls` may hold two records for one (a provider failure and its stand-in)
    visited = [agent.name]
    several_writers = shared(turn.history)  # the turn adds no customer messages: once, not once per call
    nudged_at = 0
    nudged = False  # the model was told once, on the next call, that its answer could not be used; never stored
    prepared: set[str] = set()  # agents given their look-ups for this message (once each, even after a hand-back)
    limit = asyncio.Semaphore(config.max_parallel_tools)

    def told(key: Text) -> str:
        return config.texts.get(key, turn.language)

    async def emit(event: Event) -> None:
        if on_event is not None:
            await on_event(event)

    async def finish(outcome: Reply | Escalate, text: str) -> TurnResult:
        if isinstance(outcome, Escalate):
            new.append(Message("assistant", text, agent=agent.name))
        await emit(outcome)
        sources = grounding(tools, agent.name) if isinstance(outcome, Reply) else ()
        return TurnResult(
            agent.name, context, tuple(new), outcome, text, tuple(handoffs), tuple(tools), tuple(calls), sources
        )

    async def switch(record: HandoffRecord) -> Agent:
        handoffs.append(record)
        await emit(record)
        visited.append(record.to_agent)
        return roster[record.to_agent]

    await emit(TurnStarted(agent.name, turn.asker, turn.language))
    while True:
        if router is not None and asked == 0 and not handoffs:  # once, before the turn's first call
            routed = await _route(router, agent, turn, roster)
            if routed is not None:
                agent = await switch(HandoffRecord(agent.name, routed.agent, routed.reason))
                # The model may undo a wrong route once: handing back to where the router took it from is not
                # ping-pong.
                visited[:] = [agent.name]
        if asked >= config.max_llm_calls:
            ran_out = Escalate("LLM call budget for one message ran out", "budget")
            return await finish(ran_out, told(Text.BUDGET_MESSAGE))
        agent_tools, schemas = roster.listing(agent.name)
        if agent.name not in prepared:
            prepared.add(agent.name)
            ctx = ToolContext(turn.conversation_id, turn.inbound_id, agent.name, context, db, turn.asker)
            ready = await _prepare(agent, turn, agent_tools, ctx, limit, emit, config)
            if ready:
                # Shown as one call of the model's with its results: the pairing holds and the prefix stays cacheable.
                new.append(Message("assistant", None, agent=agent.name, tool_calls=tuple(r.call for r in ready)))
                new.extend(
                    Message("tool", r.output, agent.name, tool_call_id=r.call.id, name=r.call.name) for r in ready
                )
                tools.extend(ready)
                for run in ready:
                    await emit(run)
        model_name = agent.model or config.default_model
        window = build_window(
            system=[*_system_prompt(agent, context, turn.asker, shared=several_writers), *speaks(turn.language)],
            history=(*turn.history, *new),
            tools=schemas,
            budget=config.token_budget,
            summary=turn.summary,
            closing=NUDGE if nudged and asked == nudged_at else None,
        )
        asked += 1
        # Only a listener makes it worth streaming: the chat CLI, the evals and the tests ask as before.
        on_text = _Preview(emit, agent.name, asked) if on_event is not None and config.stream else None
        try:
            response = await model.complete(model=model_name, messages=window, tools=schemas, on_text=on_text)
        except ProviderError as exc:
            calls.append(LLMCallRecord(agent.name, model_name, False, str(exc), Usage(), 0.0))
            failure = Escalate(f"LLM provider failure ({exc.kind})", "provider")
            return await finish(failure, told(Text.PROVIDER_FAILURE_MESSAGE))
        if response.fallback_from is not None:
            calls.append(LLMCallRecord(agent.name, model_name, False, response.fallback_from, Usage(), 0.0))
        answered_by = response.model or model_name
        calls.append(LLMCallRecord(agent.name, answered_by, True, None, response.usage, response.latency_ms))
        response = _as_meant(response, turn, {t.name for t in agent_tools}, call_id=f"{turn.inbound_id}_{asked}")
        if response.tool_calls or (response.content or "").strip():
            # An empty answer is not kept: providers refuse an assistant message with neither text nor calls.
            new.append(Message("assistant", response.content, agent=agent.name, tool_calls=response.tool_calls))

        if response.tool_calls:
            ctx = ToolContext(turn.conversation_id, turn.inbound_id, agent.name, context, db, turn.asker)
            runs = await asyncio.gather(
                *(
                    _run_tool(call, agent.name, agent_tools, ctx, limit, emit, config.tool_timeout_s)
                    for call in response.tool_calls
                )
            )
            outcome, runs = _decide(runs, agent, roster, visited, len(handoffs), config)
            tools.extend(runs)
            for run in runs:
                await emit(run)
            new.extend(Message("tool", r.output, agent.name, tool_call_id=r.call.id, name=r.call.name) for r in runs)
        elif response.content and response.content.strip():
            outcome = Reply(response.content.strip())
        elif not nudged:
            # Asking again unchanged would get the same nothing from a deterministic model: ask once, saying what
            # was wrong (on that call only), then stop.
            nudged, nudged_at = True, asked
            outcome = RunAgain()
        else:
            unusable = Escalate("the model gave no usable answer twice", "no_answer")
            return await finish(unusable, told(Text.BUDGET_MESSAGE))

        match outcome:
            case Reply(text):
                return await finish(outcome, text)
            case Escalate(trigger="agent"):
                return await finish(outcome, told(Text.ESCALATION_MESSAGE))
            case Escalate():
                return await finish(outcome, told(Text.BUDGET_MESSAGE))
            case Handoff(target=target, reason=reason):
                agent = await switch(HandoffRecord(agent.name, target, reason))
            case RunAgain():
                pass


async def _route(router: Router, agent: Agent, turn: TurnInput, roster: Roster) -> Routed | None:
    """Where the router sends the customer's message without a call: only to one of the active agent's
    colleagues, and back to the entry agent only for a question (`agents.router.acts_on`)."""
    last = turn.history[-1] if turn.history else None
    if last is None or last.role != "user" or not last.content:
        return None
    text = _query(last.content)
    routed = await router.route(text)
    asked = next((m.content or "" for m in reversed(turn.history) if m.role == "assistant" and m.content), "")
    if (
        routed is None
        or routed.agent not in agent.handoffs
        or not acts_on(
            routed.agent, entry=roster.entry, active=agent.name, text=text, answering=asked.rstrip().endswith("?")
        )
    ):
        return None
    return routed if routed.agent in roster.agents else None


async def _prepare(
    agent: Agent,
    turn: TurnInput,
    available: Sequence[Tool],
    ctx: ToolContext,
    limit: asyncio.Semaphore,
    emit: Callable[[Event], Awaitable[None]],
    config: LoopConfig,
) -> list[ToolRecord]:
    """What the agent would look up first, done before its first call so that most answers take one call: its
    knowledge searched for the customer's message (`Agent.retrieve`, only passages that clear the bar) and the
    look-ups the message names (`Agent.prefetch`, through the agent's own tools and their checks). A look-up that
    fails or finds nothing is left out: the model can still call the tool itself."""
    last = turn.history[-1] if turn.history else None
    if last is None or last.role != "user" or not last.content:
        return []
    query = _query(last.content)

    def call_id(n: int) -> str:
        # OpenAI and Azure refuse tool-call ids over 40 characters, whatever the agent is called.
        return PREPARED + hashlib.sha1(f"{turn.inbound_id}:{agent.name}:{n}".encode()).hexdigest()[:16]

    planned = agent.prefetch(query)[:MAX_PREFETCH] if agent.prefetch is not None and config.prefetch else ()
    # Never an acting tool: a look-up runs before the model reads the message, and an action waits for a yes.
    names = {t.name for t in available if not t.acts}
    calls = [
        ToolCall(call_id(n), p.tool, json.dumps(dict(p.arguments), ensure_ascii=False))
        for n, p in enumerate(planned)
        if p.tool in names
    ]
    found, *runs = await asyncio.gather(
        _retrieve(agent, query, call_id(len(planned)), config, emit),
        *(_run_tool(call, agent.name, available, ctx, limit, emit, config.tool_timeout_s) for call in calls),
    )
    return ([found] if isinstance(found, ToolRecord) else []) + [
        r for r in runs if isinstance(r, ToolRecord) and r.ok and r.result is None
    ]


class _Preview:
    """The words of model call number `call` as `TextDelta`s, unless the text opens the way a call written as text or
    a template-wrapped answer does (`written_calls`, `_unwrapped`): the customer must not watch `<tool_call>{...`
    being typed, so such a text is held back whole and the turn's answer comes as it would without a preview."""

    OPENERS = ("<", "{", "[", "`")

    def __init__(self, emit: Callable[[Event], Awaitable[None]], agent: str, call: int) -> None:
        self.emit = emit
        self.agent = agent
        self.call = call
        self.opening = ""
        """What came before the first character that is not a space, which decides."""
        self.shown: bool | None = None

    async def __call__(self, text: str) -> None:
        if self.shown is None:
            self.opening += text
            start = self.opening.lstrip()
            if not start:
                return
            self.shown = not start.startswith(self.OPENERS)
            text = start
        if self.shown:
            await self.emit(TextDelta(self.agent, text, self.call))


NUDGE = (
    "Your last answer could not be used: it was empty, the customer's own words, or a tool call written as text. "
    "Answer the customer's last "
    "message in words, from what is above; if you cannot, call the tool that hands them to the colleague who can, "
    "or escalate_to_human."
)
_WRITTEN = re.compile(r"<(tool_call|tools|function_call)>\s*(.*?)\s*(?:</\1>|$)", re.DOTALL)
"""A call in tags, as Qwen and Hermes templates write them; an unclosed tag runs to the end of the answer."""
_FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"


def written_calls(content: str | None, *, call_id: str) -> tuple[ToolCall, ...] | None:
    """The tool calls a model wrote as text, or None when the answer is not one. Read: tags (`<tool_call>{"name":
    ..., "arguments": {...}}</tool_call>`, `<tools>`, `<function_call>`), Mistral's `[TOOL_CALLS]` prefix, and an
    answer that is nothing but such JSON (an object or a list, fenced or not, in the API's own `{"type":
    "function", "function": {...}}` shape too). Untagged JSON counts only with `arguments` (or `parameters`): an
    answer that is a JSON object with a `name` is an answer. Tags or the prefix holding no readable call give an
    empty tuple: not a call, and never shown to a customer either."""
    if not content or not content.strip():
        return None
    text = content.strip()
    prefixed = text.startswith(_MISTRAL)
    text = text.removeprefix(_MISTRAL).strip()
    if fenced := _FENCED.match(text):
        text = fenced.group(1)
    tagged = [m.group(2) for m in _WRITTEN.finditer(text)]
    pieces = tagged or ([text] if text.startswith(("{", "[")) else [])
    marked = bool(tagged) or prefixed
    unreadable: tuple[ToolCall, ...] | None = () if marked else None
    found: list[ToolCall] = []
    for n, piece in enumerate(pieces):
        try:
            value = json.loads(piece)
        except ValueError:
            return unreadable
        for entry in value if isinstance(value, list) else [value]:
            nested = entry.get("function") if isinstance(entry, dict) else None
            item = nested if isinstance(nested, dict) else entry
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return unreadable
            if not marked and nested is None and "arguments" not in item and "parameters" not in item:
                return None
            arguments = item.get("arguments", item.get("parameters", {}))
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            found.append(ToolCall(f"written_{call_id}_{n}_{len(found)}", item["name"], raw))
    return tuple(found) if found else unreadable


def _as_meant(response: ModelResponse, turn: TurnInput, tools: set[str], *, call_id: str) -> ModelResponse:
    """What a model's answer means, as small local models write them: a call written as text is made when it names
    one of the agent's `tools` and never shown either way (an answer that is only a tool's name too, called with no
    arguments); an answer wrapped whole in its chat template's tags is its words; the customer's own message given
    back is no answer (content None, as empty)."""
    if response.tool_calls:
        return response
    written = written_calls(response.content, call_id=call_id)
    if written is not None:
        return replace(response, content=None, tool_calls=tuple(c for c in written if c.name in tools))
    if (named := _NAMED.match(response.content.strip() if response.content else "")) and named[1] in tools:
        # Qwen2.5-1.5B answered a customer who asked for a person with `transfer_to_support` and nothing else.
        return replace(response, content=None, tool_calls=(ToolCall(f"written_{call_id}_0_0", named[1], "{}"),))
    content = _unwrapped(response.content)
    if content is None:
        content = response.content
    return replace(response, content=None if _repeats(content, turn.history) else content)


_NAMED = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`?$")
"""An answer that is nothing but a name (`name`, `name()`, in backticks or not): a call when it names a tool."""
_WRAPPED = re.compile(r"^<(tool_response|response|answer)>\s*(.*?)\s*</\1>$", re.DOTALL)


def _unwrapped(content: str | None) -> str | None:
    """The words of an answer a model wrapped whole in template tags, quotes and all; None when it is not wrapped."""
    found = _WRAPPED.match(content.strip()) if content else None
    if found is None:
        return None
    words = found.group(2)
    if len(words) >= 2 and words[0] == words[-1] == '"':
        words = words[1:-1].strip()
    return words


ECHO_WORDS = 4
"""A message this long given back is an echo, not an answer; a shorter one may be answered in kind ("hi" - "hi")."""


def _repeats(content: str | None, history: Sequence[Message]) -> bool:
    """Whether an answer is the customer's last message again, but for case, spacing and end punctuation."""
    last = next((m.content for m in reversed(history) if m.role == "user"), None)
    if not content or not last or len(last.split()) < ECHO_WORDS:
        return False

    def plain(text: str) -> str:
        return " ".join(text.casefold().split()).strip(" .!?")

    return plain(content) == plain(last)


MAX_PREFETCH = 3
"""Look-ups planned for one message at most: a message listing many order numbers is the model's to sort out."""
QUERY_CHARS = 500
"""What of the customer's message the engine searches, routes and plans look-ups by: the question, not the text of a
file attached to it (which follows it in the message), and not repeated whole as the search's arguments."""


def _query(content: str) -> str:
    return content[:QUERY_CHARS]


async def _retrieve(
    agent: Agent, message: str, call_id: str, config: LoopConfig, emit: Callable[[Event], Awaitable[None]]
) -> ToolRecord | None:
    """The agent's knowledge searched for the customer's message; None when it has none, nothing clears the bar, or
    the search fails or is slow (the model can still search with its tool: a failed look-up must not fail the
    turn; it is logged)."""
    if agent.retrieve is None or config.retrieval_tokens <= 0:
        return None
    started = time.perf_counter()
    try:
        async with asyncio.timeout(config.tool_timeout_s):
            found = await agent.retrieve(message, config.retrieval_tokens)
    except Exception:
        log.warning("the search before %s's first call failed; the model may search itself", agent.name, exc_info=True)
        return None
    if found is None:
        return None
    call = ToolCall(call_id, found.tool, json.dumps(dict(found.arguments), ensure_ascii=False))
    await emit(ToolStarted(agent.name, call))
    took_ms = (time.perf_counter() - started) * 1000
    return ToolRecord(agent.name, call, True, found.output, took_ms, sources=found.sources)


def grounding(tools: Sequence[ToolRecord], agent: str) -> tuple[Source, ...]:
    """The knowledge `agent` was shown this turn, in the order it was shown: once per document section (a section's
    passages are one source), at most MAX_SOURCES. Another agent's searches are not what this one answered from."""
    seen: dict[tuple[str, str | None], Source] = {}
    for source in (s for record in tools if record.agent == agent and record.ok for s in record.sources):
        seen.setdefault((source.link, source.heading), source)
    return tuple(seen.values())[:MAX_SOURCES]


WRITER = "writer"
"""Names, in what is known about the conversation, the person who wrote the message being answered, as their chat
profile shows them: agents greet a customer by name from the first message instead of asking (or recording it)."""


def _system_prompt(
    agent: Agent, context: Mapping[str, Any], asker: Author | None = None, *, shared: bool = False
) -> list[str]:
    # Instructions first and unchanging within a conversation's agent, so prompt caching can hit; the
    # shared context, which changes more often, follows as its own message.
    visible = {k: v for k, v in context.items() if not k.startswith("_")}
    if asker is not None and asker.name and not shared:
        # One writer only: in a shared thread each message carries its writer's name, and a note changing with
        # every writer would cut the cached prefix at the instructions. As long as a recorded name may be.
        visible[WRITER] = asker.name[:80]
    prompt = [agent.render_instructions(visible)]
    if visible:
        prompt.append("Known about this conversation: " + json.dumps(visible, ensure_ascii=False, sort_keys=True))
    return prompt


async def _run_tool(
    call: ToolCall,
    agent: str,
    available: Sequence[Tool],
    ctx: ToolContext,
    limit: asyncio.Semaphore,
    emit: Callable[[Event], Awaitable[None]],
    timeout_s: float,
) -> ToolRecord:
    await emit(ToolStarted(agent, call))
    started = time.perf_counter()
    tool = next((t for t in available if t.name == call.name), None)
    result: HandoffTo | EscalateTo | None = None
    sources: tuple[Source, ...] = ()
    if tool is None:
        names = [t.name for t in available]
        ok, output = False, f"Error: there is no tool named {call.name!r}. Available: {names}"
    else:
        # A tool with its own limit (an operator's server) reports its own timeout, in its own words, waiting for a
        # free slot included: the loop's bound is only a backstop then.
        allowed = max(timeout_s, 2 * tool.timeout_s + 1) if tool.timeout_s is not None else timeout_s
        try:
            async with limit, asyncio.timeout(allowed):
                value = await tool.invoke(ctx, call.arguments)
            ok = True
            result = value if isinstance(value, HandoffTo | EscalateTo) else None
            if isinstance(value, Cited):
                sources = value.sources
                value = value.text
            output = "" if result is not None else value if isinstance(value, str) else str(value)
        except ToolArgumentsError as exc:
            ok, output = False, f"Error: {exc}. Call {call.name} again with corrected arguments."
        except TimeoutError:
            ok, output = False, f"Error: {call.name} did not answer within {allowed:g} s."
        except ToolUnavailable as exc:
            ok, output = False, f"Error: {exc}"
        except Exception as exc:  # a tool's failure is news for the model, not a crash of the turn
            ok, output = False, f"Error: {call.name} failed: {type(exc).__name__}: {exc}"
    source = tool.source if tool is not None else "unknown"
    return ToolRecord(agent, call, ok, output, (time.perf_counter() - started) * 1000, result, source, sources)


def _decide(
    runs: Sequence[ToolRecord],
    agent: Agent,
    roster: Roster,
    visited: Sequence[str],
    handoffs_so_far: int,
    config: LoopConfig,
) -> tuple[TurnOutcome, list[ToolRecord]]:
    """Apply the transfer policy to one response's tool results: the outcome, and the records with the text
    each transfer call gets back. An escalation wins; otherwise the first valid transfer is taken; if every
    transfer was refused and one of them for a budget (handoffs, ping-pong), the turn escalates."""
    out = list(runs)
    movers = [i for i, r in enumerate(out) if r.result is not None]
    if not movers:
        return RunAgain(), out
    refused: dict[int, str] = {}
    stop: Escalate | None = None
    chosen = next((i for i in movers if isinstance(out[i].result, EscalateTo)), None)
    for i in movers if chosen is None else ():
        target = cast(HandoffTo, out[i].result).agent
        if target not in agent.handoffs or target not in roster.agents:
            refused[i] = f"Error: {agent.name} cannot transfer to {target!r}; allowed: {list(agent.handoffs)}."
        elif target in visited:
            stop = stop or Escalate(f"ping-pong: {' -> '.join([*visited, target])}", "ping_pong")
            refused[i] = "Not performed: that agent already handled this message (ping-pong)."
        elif handoffs_so_far >= config.max_handoffs:
            stop = stop or Escalate("handoff budget for one message ran out", "budget")
            refused[i] = "Not performed: the handoff budget for this message ran out."
        else:
            chosen = i
            break
    outcome: TurnOutcome = stop or RunAgain()
    if chosen is not None:
        record = out[chosen]
        match record.result:
            case EscalateTo(reason):
                outcome = Escalate(reason, "agent")
                out[chosen] = replace(record, output="Escalated to a human colleague.")
            case HandoffTo(target, reason):
                outcome = Handoff(target, reason)
                title = roster[target].title
                out[chosen] = replace(record, output=f"Transferred to {title}. {title} now continues.")
    for i in movers:
        if i != chosen:
            default = "Error: not performed: only one transfer or escalation per response is taken."
            out[i] = replace(out[i], ok=False, result=None, output=refused.get(i, default))
    return outcome, out
