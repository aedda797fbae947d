"""`python -m bot eval FILE`: run customer conversations written in YAML through the real engine, with the configured
provider and knowledge base, and report how the agents did: what an operator checks before deploying a prompt or
model change.

    load()       the YAML file, validated (errors name the line and the field): BadFile
    evaluate()   each case in a throwaway conversation (`eval:<run>:<n>`), deleted afterwards: CaseOutcome
    summarize()  routing accuracy, escalation precision and recall, citation and contains rates, calls, tokens, cost
    compare()    what got better or worse against a previous run's JSON
    render()     the table printed; the JSON written is `report()`

A case's expectations are checked on its last answer (agent, words, citation); it escalated when any of its
messages did. Exit status: 0 when every case meets its expectations, 1 when any fails, 2 when the file (or
`--previous`) cannot be used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import delete

from agents.conversations import Conversations, ResultKind
from agents.db import models as m
from agents.identity import Author
from agents.loop import LLMCallRecord
from agents.texts import CATALOG, Text
from bot.declaration.build import helpdesk, test_customer
from bot.runtime import startup as runtime
from bot.settings import Settings


class Price(BaseModel):
    """US dollars per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input: float = Field(ge=0)
    output: float = Field(ge=0)


PRICES: Mapping[str, Price] = {
    # Public list prices (USD per million tokens) when this was written; the YAML's `prices:` or --price override them.
    "gpt-4o-mini": Price(input=0.15, output=0.60),
    "gpt-4o": Price(input=2.50, output=10.00),
    "gpt-4.1": Price(input=2.00, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, output=0.40),
    "offline": Price(input=0, output=0),
}


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    agent: str | None = None
    """The agent that should give the last answer (None: not checked)."""
    escalate: bool = False
    contains: list[str] = Field(default_factory=list)
    """Words the last answer must contain (case-insensitive)."""
    cites: bool = False
    """The last answer must cite a source (`[n]`, or the offline mode's `Source:` in the customer's language)."""


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    messages: list[str] = Field(min_length=1)
    expect: Expect = Expect()

    @field_validator("messages")
    @classmethod
    def _not_blank(cls, messages: list[str]) -> list[str]:
        if any(not text.strip() for text in messages):
            raise ValueError("a message is empty")
        return messages


class EvalFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prices: dict[str, Price] = Field(default_factory=dict)
    cases: list[Case] = Field(min_length=1)

    @field_validator("cases")
    @classmethod
    def _unique_names(cls, cases: list[Case]) -> list[Case]:
        seen: set[str] = set()
        for case in cases:
            if case.name in seen:
                raise ValueError(f"two cases are named {case.name!r}: names are how runs are compared")
            seen.add(case.name)
        return cases


class BadFile(Exception):
    """The eval file cannot be used; the message names the file, the line and the field."""


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at pydantic's error location (the nearest enclosing node found)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def load(path: Path) -> EvalFile:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadFile(f"{path}: cannot read it ({exc})") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = f"{path}:{exc.problem_mark.line + 1}" if exc.problem_mark else str(path)
        raise BadFile(f"{where}: not valid YAML: {exc.problem or exc}") from exc
    try:
        return EvalFile.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            field = ".".join(str(p) for p in loc) or "(top level)"
            line = _line_of(root, loc)
            lines.append(f"{path}:{line}: {field}: {error['msg']}" if line else f"{path}: {field}: {error['msg']}")
        raise BadFile("\n".join(lines)) from exc


_OFFLINE_CITES = sorted({words.split("{source}")[0].strip("_ ") for words in CATALOG[Text.OFFLINE_SOURCE].values()})
CITED = re.compile(r"\[\d+\]|(?<![A-Za-z0-9])(?:Sources?:|" + "|".join(map(re.escape, _OFFLINE_CITES)) + ")")
"""How the agents cite (`[n] Title`, as their instructions ask) and how the offline mode does, in each language
(`_Source: …_`, `_Fuente: …_`, ...)."""


@dataclass(frozen=True)
class CaseOutcome:
    name: str
    expected_agent: str | None
    agent: str
    expected_escalate: bool
    escalated: bool
    required: tuple[str, ...]
    """Words the last answer must contain."""
    missing: tuple[str, ...]
    """The required words it lacks."""
    expects_citation: bool
    cited: bool
    reply: str
    messages: int
    llm_calls: int
    """The agents' calls that answered; the tokens and the cost count the summaries' calls too."""
    summary_calls: int
    """Calls that folded older turns into the conversation's running summary (HISTORY_TOKENS)."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    tokens_by_model: dict[str, tuple[int, int]]
    """Prompt and completion tokens per model that answered, for the cost."""
    seconds: tuple[float, ...] = ()
    """Wall time from each message to its answer (the summary made after it not included)."""

    @property
    def routed_ok(self) -> bool | None:
        return None if self.expected_agent is None else self.agent == self.expected_agent

    @property
    def escalation_ok(self) -> bool:
        return self.escalated == self.expected_escalate

    def cost(self, prices: Mapping[str, Price]) -> float | None:
        """US dollars; None when a model has no price."""
        total = 0.0
        for model, (prompt, completion) in self.tokens_by_model.items():
            price = prices.get(model)
            if price is None:
                return None
            total += (prompt * price.input + completion * price.output) / 1e6
        return total

    def checks(self) -> dict[str, bool | None]:
        """Each expectation: passed, failed, or None when the case does not ask."""
        return {
            "routing": self.routed_ok,
            "escalation": self.escalation_ok,
            "contains": not self.missing if self.required else None,
            "citation": self.cited if self.expects_citation else None,
        }


async def evaluate(
    service: Conversations,
    spec: EvalFile,
    *,
    run_id: str,
    author: Author,
    summaries: Sequence[LLMCallRecord] = (),
) -> list[CaseOutcome]:
    """`summaries`: where the service records its summary calls (`terminal_engine(on_summary=...)`); `author`: who the
    cases write as."""
    outcomes = []
    for n, case in enumerate(spec.cases):
        key = f"eval:{run_id}:{n}"
        calls: list[LLMCallRecord] = []
        summarised = len(summaries)
        escalated, reply, agent = False, "", service.roster.entry
        seconds: list[float] = []
        for text in case.messages:
            started = time.perf_counter()
            result = await service.handle(key, text, author=author)
            seconds.append(round(time.perf_counter() - started, 3))
            calls.extend(result.llm_calls)
            escalated = escalated or result.kind == ResultKind.ESCALATED
            reply, agent = result.reply or "", result.agent
            if service.summaries is not None:
                # Made after the reply, in the background: waited for, so that the next message sees it (as a
                # customer writing a minute later would) and its cost counts for this case.
                await service.summaries.settled()
        folded = list(summaries[summarised:])
        spent = [*calls, *folded]
        by_model: dict[str, tuple[int, int]] = {}
        for call in spent:
            prompt, completion = by_model.get(call.model, (0, 0))
            by_model[call.model] = (prompt + call.usage.prompt_tokens, completion + call.usage.completion_tokens)
        outcomes.append(
            CaseOutcome(
                name=case.name,
                expected_agent=case.expect.agent,
                agent=agent,
                expected_escalate=case.expect.escalate,
                escalated=escalated,
                required=tuple(case.expect.contains),
                missing=tuple(w for w in case.expect.contains if w.casefold() not in reply.casefold()),
                expects_citation=case.expect.cites,
                cited=bool(CITED.search(reply)),
                reply=reply,
                messages=len(case.messages),
                llm_calls=sum(1 for c in calls if c.ok),
                summary_calls=len(folded),
                prompt_tokens=sum(c.usage.prompt_tokens for c in spent),
                completion_tokens=sum(c.usage.completion_tokens for c in spent),
                cached_tokens=sum(c.usage.cached_tokens or 0 for c in spent),  # None: not reported
                tokens_by_model=by_model,
                seconds=tuple(seconds),
            )
        )
    return outcomes


def _ratio(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, 4) if denominator else None


HIGHER_IS_BETTER = ("routing_accuracy", "escalation_precision", "escalation_recall", "citation_rate", "contains_rate")
LOWER_IS_BETTER = (
    "llm_calls_per_message",
    "prompt_tokens_per_message",
    "completion_tokens_per_message",
    "cost_per_message",
)


def summarize(outcomes: Sequence[CaseOutcome], prices: Mapping[str, Price]) -> dict[str, Any]:
    def rate(check: str) -> float | None:
        asked = [o.checks()[check] for o in outcomes if o.checks()[check] is not None]
        return _ratio(sum(1 for ok in asked if ok), len(asked))

    messages = sum(o.messages for o in outcomes)
    costs = [o.cost(prices) for o in outcomes]
    cost = None if any(c is None for c in costs) else sum(c for c in costs if c is not None)
    true_pos = sum(1 for o in outcomes if o.escalated and o.expected_escalate)
    waits = sorted(t for o in outcomes for t in o.seconds)
    return {
        "cases": len(outcomes),
        "messages": messages,
        "routing_accuracy": rate("routing"),
        "escalation_precision": _ratio(true_pos, sum(1 for o in outcomes if o.escalated)),
        "escalation_recall": _ratio(true_pos, sum(1 for o in outcomes if o.expected_escalate)),
        "citation_rate": rate("citation"),
        "contains_rate": rate("contains"),
        "llm_calls": sum(o.llm_calls for o in outcomes),
        "summary_calls": sum(o.summary_calls for o in outcomes),
        "prompt_tokens": sum(o.prompt_tokens for o in outcomes),
        "completion_tokens": sum(o.completion_tokens for o in outcomes),
        "cached_tokens": sum(o.cached_tokens for o in outcomes),
        "llm_calls_per_message": _ratio(sum(o.llm_calls for o in outcomes), messages),
        "prompt_tokens_per_message": _ratio(sum(o.prompt_tokens for o in outcomes), messages),
        "completion_tokens_per_message": _ratio(sum(o.completion_tokens for o in outcomes), messages),
        "cost_usd": None if cost is None else round(cost, 6),
        "cost_per_message": None if cost is None or not messages else round(cost / messages, 6),
        "seconds_per_answer_p50": round(waits[len(waits) // 2], 2) if waits else None,
        "seconds_per_answer_max": round(waits[-1], 2) if waits else None,
    }


def _case_json(outcome: CaseOutcome, prices: Mapping[str, Price]) -> dict[str, Any]:
    raw = asdict(outcome)
    cost = outcome.cost(prices)
    return {**raw, "checks": outcome.checks(), "cost_usd": None if cost is None else round(cost, 6)}


def compare(current: Mapping[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """Per case, the checks that flipped; overall, each metric that moved, and in which direction."""
    before = {c["name"]: c for c in previous.get("cases", [])}
    better: list[dict[str, str]] = []
    worse: list[dict[str, str]] = []
    for case in current["cases"]:
        old = before.get(case["name"])
        if old is None:
            continue
        for check, ok in case["checks"].items():
            was = old.get("checks", {}).get(check)
            if ok is None or was is None or ok == was:
                continue
            (better if ok else worse).append({"case": case["name"], "check": check})
    overall = {}
    old_summary = previous.get("summary", {})
    for metric in (*HIGHER_IS_BETTER, *LOWER_IS_BETTER):
        now, was = current["summary"].get(metric), old_summary.get(metric)
        if now is None or was is None or now == was:
            continue
        up = now > was
        overall[metric] = {
            "previous": was,
            "current": now,
            "change": "better" if up == (metric in HIGHER_IS_BETTER) else "worse",
        }
    names = {c["name"] for c in current["cases"]}
    return {
        "better": better,
        "worse": worse,
        "overall": overall,
        "new_cases": sorted(names - before.keys()),
        "dropped_cases": sorted(before.keys() - names),
    }


def report(
    outcomes: Sequence[CaseOutcome], prices: Mapping[str, Price], *, model: str, file: Path, previous: Any = None
) -> dict[str, Any]:
    current: dict[str, Any] = {
        "file": str(file),
        "model": model,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cases": [_case_json(o, prices) for o in outcomes],
        "summary": summarize(outcomes, prices),
    }
    current["diff"] = compare(current, previous) if previous is not None else None
    return current


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "FAIL")


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render(result: Mapping[str, Any]) -> str:
    header = ("case", "agent (expected)", "route", "escalate", "words", "cites", "calls", "tokens in/out", "cost $")
    rows = [header]
    for case in result["cases"]:
        checks = case["checks"]
        agent = case["agent"] + (f" ({case['expected_agent']})" if case["expected_agent"] else "")
        rows.append(
            (
                case["name"],
                agent,
                _mark(checks["routing"]),
                _mark(checks["escalation"]),
                _mark(checks["contains"]),
                _mark(checks["citation"]),
                str(case["llm_calls"]),
                f"{case['prompt_tokens']}/{case['completion_tokens']}",
                "unknown" if case["cost_usd"] is None else f"{case['cost_usd']:.4f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    s = result["summary"]
    cost = "unknown" if s["cost_per_message"] is None else f"${s['cost_per_message']:.5f}"
    lines += [
        "",
        f"{s['cases']} cases, {s['messages']} messages, model {result['model']}",
        f"routing accuracy      {_num(s['routing_accuracy'])}",
        f"escalation precision  {_num(s['escalation_precision'])}   recall {_num(s['escalation_recall'])}",
        f"citation rate         {_num(s['citation_rate'])}",
        f"answers with words    {_num(s['contains_rate'])}",
        f"per message           {_num(s['llm_calls_per_message'])} LLM calls, "
        f"{_num(s['prompt_tokens_per_message'], 0)} prompt and {_num(s['completion_tokens_per_message'], 0)} "
        f"completion tokens, cost {cost}",
    ]
    if s.get("seconds_per_answer_p50") is not None:
        lines.append(
            f"seconds per answer    {s['seconds_per_answer_p50']:.1f} median, {s['seconds_per_answer_max']:.1f} longest"
        )
    if s.get("summary_calls"):
        lines.append(f"running summaries     {s['summary_calls']} calls (in the tokens and the cost above)")
    diff = result.get("diff")
    if diff is not None:
        lines += ["", "against the previous run:"]
        for word in ("better", "worse"):
            for flip in diff[word]:
                lines.append(f"  {word}: {flip['case']} ({flip['check']})")
        for metric, move in diff["overall"].items():
            lines.append(f"  {move['change']}: {metric} {move['previous']} -> {move['current']}")
        for name in diff["new_cases"]:
            lines.append(f"  new case: {name}")
        for name in diff["dropped_cases"]:
            lines.append(f"  dropped case: {name}")
        if not (diff["better"] or diff["worse"] or diff["overall"] or diff["new_cases"] or diff["dropped_cases"]):
            lines.append("  no change")
    return "\n".join(lines)


def _price_flag(text: str) -> tuple[str, Price]:
    model, _, amounts = text.partition("=")
    try:
        prompt, completion = (float(x) for x in amounts.split(","))
        return model, Price(input=prompt, output=completion)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL=INPUT,OUTPUT (USD per million tokens)") from exc


def add_command(sub: Any) -> None:
    parser = sub.add_parser("eval", help="run YAML conversations through the agents and report how they did")
    parser.add_argument("file", type=Path, help="the conversations (see bot/examples/driftwing/eval.yaml)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--previous", type=Path, help="a previous run's JSON, to say what got better or worse")
    parser.add_argument(
        "--price",
        type=_price_flag,
        action="append",
        default=[],
        metavar="MODEL=IN,OUT",
        help="USD per million prompt and completion tokens for a model (overrides the file's and the built-in ones)",
    )


def _previous(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadFile(f"{path}: not a previous run's JSON ({exc})") from exc


async def run(settings: Settings, args: argparse.Namespace) -> int:
    try:
        spec, previous = load(args.file), _previous(args.previous)
    except BadFile as exc:
        print(exc, file=sys.stderr)
        return 2
    prices = {**PRICES, **spec.prices, **dict(args.price)}
    run_id = uuid.uuid4().hex[:8]
    settings, declared = helpdesk(settings)
    # The cases write as the declaration's test customer, so that questions about their own records can be answered.
    author = test_customer(declared.declaration, "eval")
    async with runtime.open_database(settings) as db:
        brain = await runtime.brain(settings, db, declared)
        try:
            unknown = sorted({c.expect.agent for c in spec.cases if c.expect.agent} - brain.roster.agents.keys())
            if unknown:
                print(
                    f"{args.file}: unknown agents {unknown}; the roster has {sorted(brain.roster.agents)}",
                    file=sys.stderr,
                )
                return 2
            summaries: list[LLMCallRecord] = []
            service = runtime.terminal_engine(settings, db, brain, on_summary=summaries.append)
            try:
                outcomes = await evaluate(service, spec, run_id=run_id, summaries=summaries, author=author)
            finally:
                if service.summaries is not None:  # a summary still being made would write into a deleted case
                    await service.summaries.settled()
                # Nothing of the run stays among real conversations (cases, stats, the admins' lists).
                async with db.sessions() as s, s.begin():
                    await s.execute(delete(m.Conversation).where(m.Conversation.key.startswith(f"eval:{run_id}:")))
        finally:
            await brain.close()
    model = "offline" if brain.offline else settings.openai_model
    result = report(outcomes, prices, model=model, file=args.file, previous=previous)
    print(render(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    # Non-zero when a case fails, so that a script or CI stops on it (2 stays a file that cannot be used).
    if failed := [o.name for o in outcomes if False in o.checks().values()]:
        print(f"{len(failed)} of {len(outcomes)} cases failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
