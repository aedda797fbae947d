"""What the model sees: a stable prefix, then as much recent history as the token budget allows.

The prefix (the agent's instructions, then the shared-context note) comes first so providers' prompt
caching can hit; tool schemas travel in the request's `tools` field in a fixed order. History is cut into
turns (a customer message and everything answered to it, so tool calls stay with their results) and the
oldest turns are dropped first. The transcript in Postgres is never trimmed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agents.messages import Message, estimate_tokens


def _turns(history: Sequence[Message]) -> list[list[Message]]:
    """Cut history into turns, each starting at a customer message: dropping whole turns keeps every tool
    call with its results, and the window always opens on something the customer said."""
    turns: list[list[Message]] = []
    for message in history:
        if message.role == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    if turns and turns[0][0].role == "tool":
        # The load limit cut into the middle of a turn; its first results have lost their call, and the
        # provider would reject them, so the partial turn goes.
        turns.pop(0)
    return turns


def _cost(unit: list[Message]) -> int:
    return sum(estimate_tokens(json.dumps(m.to_openai())) for m in unit)


def build_window(
    *, system: Sequence[str], history: Sequence[Message], tools: Sequence[dict[str, Any]], budget: int
) -> list[dict[str, Any]]:
    """System messages plus the newest whole turns that fit in `budget` tokens. The newest turn is always
    kept, even over budget: the model must see the message it is answering."""
    fixed = sum(estimate_tokens(s) for s in system) + estimate_tokens(json.dumps(list(tools)))
    remaining = budget - fixed
    kept: list[list[Message]] = []
    for unit in reversed(_turns(history)):
        cost = _cost(unit)
        if kept and cost > remaining:
            break
        kept.append(unit)
        remaining -= cost
    messages: list[dict[str, Any]] = [{"role": "system", "content": s} for s in system]
    messages.extend(m.to_openai() for unit in reversed(kept) for m in unit)
    return messages
