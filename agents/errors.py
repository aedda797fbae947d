"""The engine's exceptions, one tree:

    AgentsError
    ├── ConfigError          a roster or tool declared wrongly (caught at start-up, never mid-turn)
    ├── ProviderError        the LLM provider failed after the SDK's retries (timeout, 429, 5xx, refusal)
    ├── ToolArgumentsError   the model's arguments do not fit a tool (agents.tools; goes back to the model)
    └── ToolUnavailable      the system behind a tool is down or failed (an MCP server, an HTTP endpoint); the
                             message goes back to the model, the call is recorded as failed

Budget exhaustion and bad model output are not exceptions: they are turn outcomes (see agents.loop).
"""

from __future__ import annotations


class AgentsError(Exception):
    """Base of every error raised by `agents`."""


class ConfigError(AgentsError):
    """An agent, tool or roster is declared wrongly."""


class ProviderError(AgentsError):
    """The LLM provider did not answer usefully; `kind` is timeout, rate_limit, server, connection or other."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class ToolUnavailable(AgentsError):
    """The system a tool calls did not answer usefully: its message is what the model is told (say what failed and
    what the customer can be told), never a stack trace."""
