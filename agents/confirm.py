"""Acting tools wait for the asker's yes.

A tool declared as acting (`Tool.acts`: a refund, a cancellation, anything the operator's system does for the person
asking) runs only after that person confirmed it: the first call answers the model with the question to ask and
remembers the action in the conversation's context; the same call with `confirmed: true`, from the same person, in a
later message, within `WINDOW`, runs it, once. A model cannot confirm for the customer (the yes must come in a later
message), a bystander in a shared thread cannot confirm for them (only the asker's own message counts), and an old
yes does not carry over to a new action (each action is remembered by its arguments and used up when it runs).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.tools import Tool, ToolArgumentsError, ToolContext, ToolResult

WINDOW = timedelta(minutes=30)
"""A question not answered with a yes within this is asked again: a yes much later may answer something else."""
PENDING = "_confirmations"
"""Where the questions wait in the conversation's context; keys starting with _ are never shown to the model."""
CONFIRMED = "confirmed"


@dataclass(frozen=True)
class Question:
    """An action the asker was asked to confirm, kept in the conversation's context until it is answered."""

    tool: str
    asker: str
    """`Author.key` of the person asked: only their yes counts."""
    asked_by: str
    asked_in: int | None
    """The message the question answered: the yes must come in a later one."""
    asked_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "asker": self.asker,
            "asked_by": self.asked_by,
            "asked_in": self.asked_in,
            "asked_at": self.asked_at.isoformat(),
        }

    @classmethod
    def of(cls, raw: object) -> Question | None:
        if not isinstance(raw, Mapping):
            return None
        try:
            asked_in = raw.get("asked_in")
            return cls(
                str(raw["tool"]),
                str(raw["asker"]),
                str(raw["asked_by"]),
                int(asked_in) if asked_in is not None else None,
                datetime.fromisoformat(str(raw["asked_at"])),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def fresh(self, now: datetime) -> bool:
        return now - self.asked_at <= WINDOW


def confirming(tool: Tool) -> Tool:
    """The tool behind a confirmation; tools that do not act are returned as they are. A tool that takes a
    `confirmed` argument of its own gets `confirmed: true` once the asker said yes (and never before)."""
    if not tool.acts:
        return tool
    own = CONFIRMED in tool.parameters.get("properties", {})
    parameters = copy.deepcopy(tool.parameters)
    parameters.setdefault("properties", {})[CONFIRMED] = {
        "type": "boolean",
        "description": "true only once the customer said yes to the question this tool gave you",
    }
    if own and CONFIRMED in parameters.get("required", []):
        parameters["required"] = [r for r in parameters["required"] if r != CONFIRMED]
    inner = tool.check

    def check(raw: dict[str, Any]) -> dict[str, Any]:
        rest = dict(raw)
        confirmed = rest.pop(CONFIRMED, False)
        if not isinstance(confirmed, bool):
            raise ToolArgumentsError(f"invalid arguments: {CONFIRMED}: must be true or false")
        arguments = inner({**rest, CONFIRMED: False} if own else rest)
        arguments.pop(CONFIRMED, None)
        return {CONFIRMED: confirmed, "arguments": arguments}

    async def run(ctx: ToolContext, *, confirmed: bool, arguments: dict[str, Any]) -> ToolResult:
        return await _run(tool, ctx, confirmed, arguments, own=own)

    return Tool(
        name=tool.name,
        description=f"{tool.description} Acts for the customer: asks for their yes first.",
        parameters=parameters,
        check=check,
        fn=run,
        wants_context=True,
        source=tool.source,
        acts=True,
        timeout_s=tool.timeout_s,
    )


async def _run(tool: Tool, ctx: ToolContext, confirmed: bool, arguments: dict[str, Any], *, own: bool) -> ToolResult:
    if ctx.asker is None:
        return f"Not done: {tool.name} acts for a known person, and nobody verified is asking here. Offer a colleague."
    # Where it runs is part of the action: two agents' same-named tools from two systems share no yes.
    action = _fingerprint(f"{tool.source}:{tool.name}", arguments)
    now = datetime.now(UTC)
    # Questions past their window are forgotten, so the context does not grow with abandoned actions.
    pending = {
        key: question
        for key, raw in dict(ctx.state.get(PENDING) or {}).items()
        if (question := Question.of(raw)) is not None and question.fresh(now)
    }
    standing = pending.get(action)
    if confirmed and standing is not None and standing.asker != ctx.asker.key:
        ctx.state[PENDING] = {k: q.to_json() for k, q in pending.items()}
        return (
            f"Not done: {standing.asked_by} asked for this and only they can confirm it; this message is from "
            f"{ctx.asker.label}. Ask {standing.asked_by} to confirm."
        )
    if confirmed and standing is not None and standing.asked_in != ctx.inbound_id:
        del pending[action]
        ctx.state[PENDING] = {k: q.to_json() for k, q in pending.items()}
        call = {**arguments, CONFIRMED: True} if own else arguments
        return await (tool.fn(ctx, **call) if tool.wants_context else tool.fn(**call))
    if standing is not None and standing.asked_in != ctx.inbound_id:
        # Asked already, in an earlier message: calling again unconfirmed neither restarts the question (the yes in
        # this message still counts when the model calls with confirmed) nor hands it to someone else.
        if standing.asker != ctx.asker.key:
            return (
                f"Not done: {standing.asked_by} asked for this already and only they can confirm it; this message is "
                f"from {ctx.asker.label}."
            )
    else:
        pending[action] = Question(tool.name, ctx.asker.key, ctx.asker.label, ctx.inbound_id, now)
    ctx.state[PENDING] = {k: q.to_json() for k, q in pending.items()}
    shown = json.dumps(_plain(arguments), ensure_ascii=False, sort_keys=True, default=str)
    lead = "" if not confirmed else "The customer has not confirmed this yet in an earlier message. "
    return (
        f"{lead}Not done yet: {tool.name} needs the customer's yes. Ask them, in plain words, whether to go ahead "
        f"with {tool.name} {shown}, and once they say yes in their next message call {tool.name} again with the "
        f"same arguments and {CONFIRMED}=true."
    )


def _plain(arguments: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(arguments, default=str))


def _fingerprint(name: str, arguments: Mapping[str, Any]) -> str:
    canonical = json.dumps([name, _plain(arguments)], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]
