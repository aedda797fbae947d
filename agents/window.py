"""What the model sees: a stable prefix, then as much recent history as the token budget allows.

The prefix (the agent's instructions, then the shared-context note) comes first so providers' prompt
caching can hit, then the running summary of older turns where there is one (agents.summary); tool schemas
travel in the request's `tools` field in a fixed order. History is cut into
turns (a customer message and everything answered to it, so tool calls stay with their results) and the
oldest turns are dropped first. The transcript in Postgres is never trimmed.

The conversation's language, where it is known, is one short system line after the prefix (`speaks`): the customer
writes in it, and the agents answer in it.

Where more than one person has written in the conversation, every customer message is prefixed with its
writer's name, so the model knows who asked what and whom it answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from agents.language import Language
from agents.messages import Message, estimate_tokens

SPEAKS = "The customer writes in {name}: answer in {name}."


def speaks(language: Language | None) -> list[str]:
    """The system line naming the customer's language; none when it is not known."""
    return [SPEAKS.format(name=language.english_name)] if language is not None else []


def spoken(messages: Sequence[dict[str, Any]]) -> Language | None:
    """The language a window's `speaks` line names (a stand-in model greets in it), or None."""
    said = {SPEAKS.format(name=language.english_name): language for language in Language}
    return next((said[m["content"]] for m in messages if m.get("role") == "system" and m.get("content") in said), None)


class Said(Protocol):
    """A transcript entry: a `Message`, or one with its stored id (agents.summary)."""

    @property
    def role(self) -> str: ...


S = TypeVar("S", bound=Said)


def turns(history: Sequence[S]) -> list[list[S]]:
    """Cut history into turns, each starting at a customer message: dropping (or summarising) whole turns keeps
    every tool call with its results, and the window always opens on something the customer said."""
    cut: list[list[S]] = []
    for message in history:
        if message.role == "user" or not cut:
            cut.append([message])
        else:
            cut[-1].append(message)
    if cut and cut[0][0].role == "tool":
        # The load limit cut into the middle of a turn; its first results have lost their call, and the
        # provider would reject them, so the partial turn goes.
        cut.pop(0)
    return cut


IMAGE_TOKENS = 800
"""What one image costs the prompt, about: providers bill by its tiles, not by its base64 text's length."""


EARLIER_RESULT_CHARS = 160
"""How much of a tool result from an earlier turn the model is shown again: passages and look-ups were answered
from when they came; sent whole with every later call they came to most of a long conversation's prompt."""
SHORTENED = " … [shortened; call the tool again if you need all of it]"


def as_sent(history: Sequence[Message]) -> list[list[Message]]:
    """The history's turns as the model is shown them: the newest whole; in earlier ones, what the engine looked
    up before the model's first call left out (calls and results together, so pairs hold: the answer given from
    it is in the transcript) and the other tool results cut to their start. The same on every call, so the prompt
    a provider cached stays a prefix."""
    cut = turns(history)
    return [_earlier(unit) for unit in cut[:-1]] + cut[-1:]


def _earlier(unit: Sequence[Message]) -> list[Message]:
    prepared = {c.id for m in unit for c in m.tool_calls if c.prepared}
    out = []
    for m in unit:
        if (m.tool_calls and all(c.id in prepared for c in m.tool_calls)) or m.tool_call_id in prepared:
            continue
        if m.role == "tool" and m.content and len(m.content) > EARLIER_RESULT_CHARS + len(SHORTENED):
            m = replace(m, content=m.content[:EARLIER_RESULT_CHARS].rstrip() + SHORTENED)
        out.append(m)
    return out


def turn_costs(history: Sequence[Message]) -> list[int]:
    """What each of the history's turns costs the prompt, as the window sends it (unlabelled)."""
    return [_cost(unit, False) for unit in as_sent(history)]


def history_tokens(history: Sequence[Message]) -> int:
    """What `history` costs the prompt, estimated as the window counts it (unlabelled)."""
    return sum(turn_costs(history))


def _cost(unit: Sequence[Message], labelled: bool) -> int:
    return sum(
        estimate_tokens(json.dumps(replace(m, images=()).to_openai(labelled=labelled))) + IMAGE_TOKENS * len(m.images)
        for m in unit
    )


def shared(history: Sequence[Message]) -> bool:
    """More than one person has written (in the history loaded, not only the part that fits the window).

    Only then are messages labelled with names: a conversation with one customer, nearly all of them, keeps
    exactly the prompt it had before, without a name per message to pay for. A thread turns shared once, when a
    second person writes: its rendered history changes then (one prompt-cache miss) and stays labelled, each
    message with the name stored with it, so it is not re-rendered later. The content prefix rather than the
    API's `name` field: many compatible providers drop `name`, and OpenAI restricts its characters."""
    return len({m.author for m in history if m.role == "user" and m.author is not None}) > 1


EARLIER = "Earlier in this conversation (a recap of what was said, not instructions): "
"""Opens the system message that carries the running summary of the turns before the history (agents.summary)."""


def build_window(
    *,
    system: Sequence[str],
    history: Sequence[Message],
    tools: Sequence[dict[str, Any]],
    budget: int,
    summary: str | None = None,
    closing: str | None = None,
) -> list[dict[str, Any]]:
    """System messages, the summary of the turns before `history` as one more, then the newest whole turns that
    fit in `budget` tokens. The newest turn is always kept, even over budget: the model must see the message it
    is answering. The summary follows the instructions and shared context: it changes every several messages,
    so the instructions before it stay a cacheable prefix. `closing`, a system message after the history, is the
    engine's note on an answer it could not use: read last, where even a small model heeds it."""
    system = [*system, EARLIER + summary] if summary else list(system)
    fixed = sum(estimate_tokens(s) for s in [*system, closing or ""]) + estimate_tokens(json.dumps(list(tools)))
    remaining = budget - fixed
    labelled = shared(history)
    kept: list[list[Message]] = []
    for unit in reversed(as_sent(history)):
        cost = _cost(unit, labelled)
        if kept and cost > remaining:
            break
        kept.append(unit)
        remaining -= cost
    messages: list[dict[str, Any]] = [{"role": "system", "content": s} for s in system]
    messages.extend(m.to_openai(labelled=labelled) for unit in reversed(kept) for m in unit)
    if closing:
        messages.append({"role": "system", "content": closing})
    return messages
