"""Agent declarations and the roster that holds them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.confirm import confirming
from agents.db.deliveries import Source
from agents.errors import ConfigError
from agents.tools import EscalateTo, HandoffTo, Tool, function_tool
from agents.toolsets import Toolset

log = logging.getLogger(__name__)

Instructions = str | Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Retrieved:
    """Passages found for the customer's message before the agent's first call, shown to the model as if it
    had called `tool` with `arguments` and got `output` back."""

    tool: str
    arguments: Mapping[str, Any]
    output: str
    sources: tuple[Source, ...] = ()
    """The passages' documents, cited under an answer written from them."""


Retriever = Callable[[str, int], Awaitable[Retrieved | None]]
"""(customer's message, token budget for the passages) -> what clears the bar, or None when nothing does."""


@dataclass(frozen=True)
class Planned:
    """A look-up the customer's message makes certain (an order number named: look the order up), called
    through the agent's own tool before its first model call, so the model starts with the answer at hand."""

    tool: str
    arguments: Mapping[str, Any]


Prefetch = Callable[[str], Sequence[Planned]]
"""The customer's message -> the look-ups it calls for; deterministic and cheap (a pattern, not a model)."""


@dataclass(frozen=True)
class Agent:
    name: str
    """Stable identifier, stored in Postgres as the active agent; also names its `transfer_to_<name>` tool."""
    title: str
    """How customers see it ("Sales"), e.g. in "Connecting you with Sales…"."""
    description: str
    """One paragraph: what this agent handles. Other agents read it in their transfer tools."""
    instructions: Instructions
    """The system prompt; a function of the shared context when it needs the customer's name and the like."""
    tools: tuple[Tool, ...] = ()
    handoffs: tuple[str, ...] = ()
    """Names of the agents this one may transfer to."""
    model: str | None = None
    """Overrides the configured default model."""
    retrieve: Retriever | None = None
    """Searches its knowledge base for the customer's message before its first call in a turn (agents.loop)."""
    prefetch: Prefetch | None = None
    """Plans look-ups with its own tools for the customer's message before its first call in a turn (agents.loop);
    the tools run as if the model had called them, with the same checks of who is asking."""
    examples: tuple[str, ...] = ()
    """Short customer-style messages this agent handles: what agents.router compares a message with to route it
    without a model call. Empty: the router never names this agent."""
    toolsets: tuple[Toolset, ...] = ()
    """Tools from the operator's systems (MCP servers, HTTP endpoints), which may change while the bot runs."""
    knowledge: tuple[str, ...] = ()
    """The knowledge base collections it searches (`search_knowledge`), for the offline stand-in and /support."""

    def render_instructions(self, context: Mapping[str, Any]) -> str:
        return self.instructions(context) if callable(self.instructions) else self.instructions


def escalate_tool() -> Tool:
    async def escalate_to_human(reason: str) -> EscalateTo:
        """Bring in a human colleague."""
        return EscalateTo(reason=reason)

    tool: Tool = function_tool(escalate_to_human)
    return tool


def handoff_tool(target: Agent) -> Tool:
    async def transfer(reason: str | None = None) -> HandoffTo:
        return HandoffTo(agent=target.name, reason=reason)

    tool: Tool = function_tool(
        transfer,
        name=f"transfer_to_{target.name}",
        # One short line: the instructions say what goes to whom and not to announce it; every call pays for this.
        description=f"Transfer to {target.title}.",
    )
    return tool


MAX_TOOLS = 128
"""Tools one request may offer the model: OpenAI's limit, which the providers copying its API keep."""


@dataclass(frozen=True)
class _Listing:
    versions: tuple[int, ...]
    tools: tuple[Tool, ...]
    schemas: list[dict[str, Any]]


@dataclass(frozen=True)
class Roster:
    """Every agent, keyed by name, with the entry agent new conversations start with."""

    agents: Mapping[str, Agent]
    entry: str
    _tools: Mapping[str, tuple[Tool, ...]] = field(default_factory=dict, repr=False)
    _schemas: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    _own: Mapping[str, tuple[Tool, ...]] = field(default_factory=dict, repr=False)
    _moves: Mapping[str, tuple[Tool, ...]] = field(default_factory=dict, repr=False)
    _drawn: dict[str, _Listing] = field(default_factory=dict, repr=False)
    """Agents with toolsets: their list as of their sources' versions, rebuilt when one moves."""

    @classmethod
    def of(cls, agents: Iterable[Agent], *, entry: str) -> Roster:
        by_name = {a.name: a for a in agents}
        if entry not in by_name:
            raise ConfigError(f"entry agent {entry!r} is not in the roster")
        escalate = escalate_tool()
        tools: dict[str, tuple[Tool, ...]] = {}
        own: dict[str, tuple[Tool, ...]] = {}
        moves: dict[str, tuple[Tool, ...]] = {}
        for agent in by_name.values():
            for target in agent.handoffs:
                if target not in by_name:
                    raise ConfigError(f"{agent.name} hands off to unknown agent {target!r}")
                if target == agent.name:
                    raise ConfigError(f"{agent.name} cannot hand off to itself")
            own[agent.name] = tuple(confirming(t) for t in agent.tools)
            moves[agent.name] = (*(handoff_tool(by_name[t]) for t in agent.handoffs), escalate)
            # Stable order (own tools, transfers, escalation) keeps the prompt prefix cacheable.
            all_tools = (*own[agent.name], *moves[agent.name])
            names = [t.name for t in all_tools]
            if len(names) != len(set(names)):
                raise ConfigError(f"{agent.name} has two tools with one name: {names}")
            tools[agent.name] = all_tools
        # Built once: every LLM call would pay for rebuilding them otherwise.
        schemas = {name: [t.schema() for t in agent_tools] for name, agent_tools in tools.items()}
        return cls(agents=by_name, entry=entry, _tools=tools, _schemas=schemas, _own=own, _moves=moves)

    def _listing(self, name: str) -> _Listing | None:
        """The tool list of an agent with toolsets, current with its sources."""
        agent = self.agents[name]
        if not agent.toolsets:
            return None
        versions = tuple(toolset.source.version for toolset in agent.toolsets)
        listing = self._drawn.get(name)
        if listing is not None and listing.versions == versions:
            return listing
        taken = {t.name for t in (*self._own[name], *self._moves[name])}
        drawn: list[Tool] = []
        for toolset in agent.toolsets:
            for tool in toolset.tools():
                if tool.name in taken:
                    log.warning(
                        "%s: %s of %s has the name of another of its tools and is left out",
                        name,
                        tool.name,
                        tool.source,
                    )
                    continue
                taken.add(tool.name)
                drawn.append(confirming(tool))
        room = MAX_TOOLS - len(self._own[name]) - len(self._moves[name])
        if len(drawn) > room:
            log.warning(
                "%s is offered %d tools; providers take %d at most, so %d are left out",
                name,
                len(drawn) + len(self._own[name]) + len(self._moves[name]),
                MAX_TOOLS,
                len(drawn) - room,
            )
            drawn = drawn[: max(room, 0)]
        tools = (*self._own[name], *drawn, *self._moves[name])
        listing = _Listing(versions, tools, [t.schema() for t in tools])
        self._drawn[name] = listing
        return listing

    def __getitem__(self, name: str) -> Agent:
        return self.agents[name]

    def get(self, name: str) -> Agent:
        """The named agent, or the entry agent when the name is no longer in the roster (a renamed agent
        must not strand old conversations)."""
        return self.agents.get(name) or self.agents[self.entry]

    def listing(self, name: str) -> tuple[tuple[Tool, ...], list[dict[str, Any]]]:
        """An agent's tools and their schemas, taken together: a server relisting between the two cannot show the
        model a tool the turn then cannot find."""
        listing = self._listing(name)
        return (self._tools[name], self._schemas[name]) if listing is None else (listing.tools, listing.schemas)

    def tools_of(self, name: str) -> tuple[Tool, ...]:
        listing = self._listing(name)
        return self._tools[name] if listing is None else listing.tools
