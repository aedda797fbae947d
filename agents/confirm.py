"""Acting tools wait for the asker's yes.

A tool declared as acting (`Tool.acts`: a refund, a cancellation, anything the operator's system does for the person
asking) runs only after that person confirmed it. The first call answers the model with the question to ask and keeps
a `Question` in the conversation's context: who was asked (the verified asker, never the model's word), in which
message, the action and its arguments. A call with `confirmed: true` from the same person, in a later message, within
`WINDOW`, runs the action with the arguments they were asked about, once.

- A model cannot confirm for the customer: the yes must come in a later message than the question.
- Questions belong to their asker: a bystander in a shared thread can neither confirm someone else's nor take it over
  (their own calls are their own questions, for actions the operator's system decides they may take).
- Once: a question that ran is kept as done until its window ends; asking again, or confirming twice in one answer,
  does not run it again.
- Idempotent: the action's key (`ToolContext.idempotency_key`) comes from the question, so a retry after a failure
  or a turn run again after a crash asks the operator's system for the same action, not a second one.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from agents.tools import Tool, ToolArgumentsError, ToolContext, ToolResult

WINDOW = timedelta(minutes=30)
"""A question not answered with a yes within this is asked again: a yes much later may answer something else."""
PENDING = "_confirmations"
"""Where the questions wait in the conversation's context; keys starting with _ are never shown to the model."""
CONFIRMED = "confirmed"
MAX_QUESTIONS = 20
"""Questions kept per conversation at most (the oldest go first): the context is stored with every turn."""

Status = Literal["asked", "running", "done"]


@dataclass(frozen=True)
class Question:
    """An action the asker was asked to confirm."""

    tool: str
    """`source:name:agent` of the tool: the same name on two systems, or for two agents, is two actions."""
    asker: str
    """`Author.key` of the person asked: only their yes counts."""
    asked_in: int | None
    """The message the question answered: the yes must come in a later one."""
    asked_at: datetime
    arguments: dict[str, Any]
    """What the asker was asked about: what runs when they say yes."""
    status: Status = "asked"
    ran_in: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "asker": self.asker,
            "asked_in": self.asked_in,
            "asked_at": self.asked_at.isoformat(),
            "arguments": self.arguments,
            "status": self.status,
            "ran_in": self.ran_in,
        }

    @classmethod
    def of(cls, raw: object) -> Question | None:
        """A stored question, or None for anything unreadable (written by an older version, or damaged): that action
        is simply asked again."""
        if not isinstance(raw, Mapping):
            return None
        try:
            asked_at = datetime.fromisoformat(str(raw["asked_at"]))
            status = raw.get("status", "asked")
            arguments = raw["arguments"]
            if status not in ("asked", "running", "done") or not isinstance(arguments, dict):
                return None
            asked_in, ran_in = raw.get("asked_in"), raw.get("ran_in")
            return cls(
                str(raw["tool"]),
                str(raw["asker"]),
                int(asked_in) if asked_in is not None else None,
                asked_at if asked_at.tzinfo else asked_at.replace(tzinfo=UTC),
                arguments,
                status,
                int(ran_in) if ran_in is not None else None,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def fresh(self, now: datetime) -> bool:
        return now - self.asked_at <= WINDOW

    def key(self, conversation_id: int) -> str:
        """The action's idempotency key: the same for every try at this one confirmed action."""
        basis = f"{conversation_id}:{self.asker}:{self.asked_in}:{self.tool}:{_canonical(self.arguments)}"
        return hashlib.sha256(basis.encode()).hexdigest()


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
    now = datetime.now(UTC)
    questions = _questions(ctx.state, now)
    name = f"{tool.source}:{tool.name}:{ctx.agent}"
    plain = _plain(arguments)
    mine = {k: q for k, q in questions.items() if q.asker == ctx.asker.key and q.tool == name}
    action = _fingerprint(ctx.asker.key, name, plain)
    question = mine.get(action)
    if confirmed and question is None:
        # Arguments written a little differently on the yes ("10.0" for 10, a reason reworded): the one question
        # this person has open for this tool is what they said yes to.
        open_ones = [(k, q) for k, q in mine.items() if q.status == "asked"]
        if len(open_ones) == 1:
            action, question = open_ones[0]
    if question is not None and question.status != "asked":
        if question.ran_in == ctx.inbound_id or question.status == "running":
            return f"Already done (or under way) for this message: do not call {tool.name} again for it."
        question = None  # done in an earlier message: a new request for the same action is a new question
    if confirmed and question is not None and question.asked_in != ctx.inbound_id:
        return await _act(tool, ctx, questions, action, question, own=own)
    if question is None:
        question = Question(name, ctx.asker.key, ctx.inbound_id, now, plain)
        questions[action] = question
        _store(ctx.state, questions)
    lead = "The customer has not confirmed this yet in a later message than the question. " if confirmed else ""
    shown = json.dumps(question.arguments, ensure_ascii=False, sort_keys=True)
    return (
        f"{lead}Not done yet: {tool.name} needs the customer's yes. Ask them, in plain words, whether to go ahead "
        f"with {tool.name} {shown}, and only once they say yes in their next message call {tool.name} again with "
        f"{CONFIRMED}=true."
    )


async def _act(
    tool: Tool, ctx: ToolContext, questions: dict[str, Question], action: str, question: Question, *, own: bool
) -> ToolResult:
    # Marked before the first await: a second confirmed call in the same answer (they run concurrently) sees it.
    questions[action] = replace(question, status="running", ran_in=ctx.inbound_id)
    _store(ctx.state, questions)
    acting = replace(ctx, idempotency_key=question.key(ctx.conversation_id))
    # What the asker was asked about, checked again into the tool's own types (stored, they are plain JSON).
    call = tool.check({**question.arguments, CONFIRMED: True} if own else dict(question.arguments))
    if own:
        call[CONFIRMED] = True
    try:
        result = await (tool.fn(acting, **call) if tool.wants_context else tool.fn(**call))
    except BaseException:
        # Not done, as far as anyone knows: the question stands, and a retry asks with the same key.
        questions[action] = question
        _store(ctx.state, questions)
        raise
    questions[action] = replace(question, status="done", ran_in=ctx.inbound_id)
    _store(ctx.state, questions)
    return result


def _questions(state: Mapping[str, Any], now: datetime) -> dict[str, Question]:
    """The conversation's questions still in their window; anything unreadable is dropped."""
    stored = state.get(PENDING)
    if not isinstance(stored, Mapping):
        return {}
    return {
        str(key): question
        for key, raw in stored.items()
        if (question := Question.of(raw)) is not None and question.fresh(now)
    }


def _store(state: dict[str, Any], questions: dict[str, Question]) -> None:
    kept = sorted(questions.items(), key=lambda item: item[1].asked_at)[-MAX_QUESTIONS:]
    state[PENDING] = {key: question.to_json() for key, question in kept}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _plain(arguments: Mapping[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(dict(arguments), default=str))
    return plain


def _fingerprint(asker: str, tool: str, arguments: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical([asker, tool, arguments]).encode()).hexdigest()[:24]
