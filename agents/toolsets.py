"""Tools from outside the engine: the operator's MCP servers and HTTP endpoints, as sources an agent draws from.

A `ToolSource` offers a set of tools that may change while the bot runs (an MCP server lists its tools when it
connects, and again after it restarts) and says how it is doing (`SourceStatus`, for `/support status`, metrics and
logs). An agent's `Toolset` picks from one source: all of its tools, or an allow-list. The roster asks its sources
for their tools when it builds an agent's tool list, and rebuilds only when a source's `version` moved.

A source never fails a turn by being down: its tools answer the model that the system is unavailable (the model
can say so, or bring in a person), and it reconnects in the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from agents.tools import Tool


@dataclass(frozen=True)
class SourceStatus:
    name: str
    """The source's name in the operator's declaration (an MCP server's key, "http" for the HTTP tools)."""
    kind: str
    """"mcp" or "http"."""
    up: bool
    detail: str
    """What an admin reads: "4 tools", or why it is down and what the bot does about it."""
    tools: int
    since: datetime | None = None
    """When it last changed between up and down."""


class ToolSource(Protocol):
    name: str

    @property
    def version(self) -> int:
        """Changes whenever `tools()` would return something else."""

    def tools(self) -> tuple[Tool, ...]:
        """The tools offered now; an MCP server's last listing while it is down (calls then say it is down)."""

    def status(self) -> SourceStatus: ...

    async def start(self) -> None:
        """Connect and list the tools. Never raises for a system that is down: it reports it and keeps trying."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Toolset:
    """The tools an agent may call from one source: all of them, or only those named."""

    source: ToolSource
    only: frozenset[str] | None = None

    def tools(self) -> tuple[Tool, ...]:
        offered = self.source.tools()
        return offered if self.only is None else tuple(t for t in offered if t.name in self.only)
