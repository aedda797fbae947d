"""Fast unit tests of the run loop, the transfer policy and the window, with an in-process scripted model (the
`Model` seam) and no database: milliseconds each, beside the HTTP-level tests of tests/test_engine.py."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace
from typing import Any

import pytest

from agents.agent import Roster
from agents.errors import ProviderError
from agents.identity import Author
from agents.loop import Escalate, LoopConfig, Reply, TurnInput, run_turn
from agents.messages import PREPARED, Message, ToolCall
from agents.model import ModelResponse, TextSink, Usage
from agents.texts import Text
from agents.window import SHORTENED, build_window
from harness.sample import default_roster

CONFIG = LoopConfig(default_model="scripted", max_llm_calls=4, max_handoffs=2)


class ScriptedModel:
    """Answers from a script; records what each call was shown."""

    def __init__(self, *answers: ModelResponse | Exception) -> None:
        self.answers: deque[ModelResponse | Exception] = deque(answers)
        self.seen: list[dict[str, Any]] = []

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        self.seen.append({"messages": messages, "tools": [t["function"]["name"] for t in tools]})
        answer = self.answers.popleft() if self.answers else text("")
        if isinstance(answer, Exception):
            raise answer
        return answer


def text(content: str) -> ModelResponse:
    return ModelResponse(content, (), Usage(10, 5), 1.0)


def calls(*pairs: tuple[str, dict[str, Any] | str]) -> ModelResponse:
    made = tuple(
        ToolCall(f"call_{n}", name, arguments if isinstance(arguments, str) else json.dumps(arguments))
        for n, (name, arguments) in enumerate(pairs)
    )
    return ModelResponse(None, made, Usage(10, 5), 1.0)


def turn(message: str = "hi", agent: str = "triage") -> TurnInput:
    return TurnInput(1, 1, agent, {}, (Message("user", message),))


async def run(model: ScriptedModel, message: str = "hi", agent: str = "triage") -> Any:
    return await run_turn(turn(message, agent), roster=default_roster(), model=model, config=CONFIG)


async def test_a_direct_answer_is_one_call_and_a_reply() -> None:
    model = ScriptedModel(text("Hello!"))
    result = await run(model)
    assert result.outcome == Reply("Hello!") and result.reply == "Hello!" and result.agent == "triage"
    assert len(result.llm_calls) == 1 and len(model.seen) == 1


async def test_a_handoff_switches_agent_and_the_new_agent_answers_in_the_same_turn() -> None:
    model = ScriptedModel(calls(("transfer_to_sales", {"reason": "buying"})), text("The X4 is $899."))
    result = await run(model, "how much is the X4?")
    assert (result.agent, result.reply) == ("sales", "The X4 is $899.")
    assert [(h.from_agent, h.to_agent, h.reason) for h in result.handoffs] == [("triage", "sales", "buying")]
    assert "transfer_to_sales" in model.seen[0]["tools"] and "transfer_to_sales" not in model.seen[1]["tools"]
    assert model.seen[1]["messages"][-1]["role"] == "tool"  # the new agent sees the transfer's result


async def test_an_escalation_wins_over_a_transfer_in_the_same_response() -> None:
    model = ScriptedModel(
        calls(("transfer_to_sales", {"reason": "x"}), ("escalate_to_human", {"reason": "wants a person"}))
    )
    result = await run(model)
    assert result.outcome == Escalate("wants a person", "agent") and not result.handoffs
    assert [t.ok for t in result.tools] == [False, True]


async def test_the_first_valid_transfer_wins() -> None:
    model = ScriptedModel(
        calls(("transfer_to_sales", {"reason": "a"}), ("transfer_to_support", {"reason": "b"})), text("ok")
    )
    result = await run(model)
    assert [h.to_agent for h in result.handoffs] == ["sales"]
    assert "only one transfer" in result.tools[1].output


async def test_ping_pong_is_stopped_with_a_human() -> None:
    model = ScriptedModel(
        calls(("transfer_to_sales", {"reason": "a"})),
        calls(("transfer_to_triage", {"reason": "b"})),
    )
    result = await run(model)
    assert isinstance(result.outcome, Escalate) and result.outcome.trigger == "ping_pong"
    assert result.reply == CONFIG.texts.get(Text.BUDGET_MESSAGE)


async def test_the_llm_call_budget_ends_in_a_human() -> None:
    # A model that keeps calling tools: asked again after each, within the budget.
    model = ScriptedModel(*(calls(("record_customer_name", {"name": f"Sam {n}"})) for n in range(10)))
    result = await run(model)
    assert isinstance(result.outcome, Escalate) and result.outcome.trigger == "budget"
    assert len(model.seen) == CONFIG.max_llm_calls


async def test_an_empty_answer_gets_one_nudge_then_an_outcome_of_its_own() -> None:
    """A deterministic model asked the same again answers the same: once, saying what was wrong, then a person."""
    model = ScriptedModel(text(""), text("  "), text("never asked"))
    result = await run(model)
    assert isinstance(result.outcome, Escalate) and result.outcome.trigger == "no_answer"
    assert result.reply == CONFIG.texts.get(Text.BUDGET_MESSAGE) and len(model.seen) == 2
    first, second = (seen["messages"] for seen in model.seen)
    assert not any("could not be used" in str(m["content"]) for m in first)
    # Said last, after the history, where a small model heeds it (it ignored the same note among the instructions).
    assert second[-1]["role"] == "system" and "could not be used" in second[-1]["content"]
    assert second[:-1] == first
    # The nudge is said, not stored: the turn adds no message of it.
    assert all("could not be used" not in (m.content or "") for m in result.messages)


async def test_a_call_written_as_text_is_made_and_never_shown_to_the_customer() -> None:
    """Small local models write a transfer as text (`<tools>{...}</tools>`): it is made, as if called."""
    written = '<tools>\n{"name": "transfer_to_sales", "arguments": {"reason": "a drone question"}}\n</tools>'
    model = ScriptedModel(text(written), text("The Kestrel Mini 2 is our lightest drone."))
    result = await run(model, "which drone is lightest?")
    assert [h.to_agent for h in result.handoffs] == ["sales"]
    assert isinstance(result.outcome, Reply) and "<tools>" not in result.reply
    assert all("<tools>" not in (m.content or "") for m in result.messages)


@pytest.mark.parametrize(
    "written",
    [
        '```json\n{"name": "transfer_to_sales", "arguments": {}}\n```',
        '[{"name": "transfer_to_sales", "arguments": {"reason": "drones"}}]',
        '<tool_call>\n{"name": "transfer_to_sales", "arguments": {}}',  # the closing tag never came
        '[TOOL_CALLS][{"name": "transfer_to_sales", "arguments": {}}]',  # Mistral's
    ],
)
async def test_calls_written_fenced_as_lists_unclosed_or_mistrals_way_are_made(written: str) -> None:
    model = ScriptedModel(text(written), text("The Kestrel Mini 2 is our lightest drone."))
    result = await run(model, "which drone is lightest?")
    assert [h.to_agent for h in result.handoffs] == ["sales"]
    assert result.reply == "The Kestrel Mini 2 is our lightest drone."


@pytest.mark.parametrize("written", ["transfer_to_sales", " `transfer_to_sales` ", "transfer_to_sales()"])
async def test_an_answer_that_is_only_a_tools_name_calls_it(written: str) -> None:
    """Qwen2.5-1.5B, asked for a person, answered `transfer_to_support` and nothing else: the call, not words."""
    model = ScriptedModel(text(written), text("The Kestrel Mini 2 is our lightest drone."))
    result = await run(model, "which drone is lightest?")
    assert [h.to_agent for h in result.handoffs] == ["sales"]
    assert result.reply == "The Kestrel Mini 2 is our lightest drone."
    # A name that is no tool of the agent's is an answer like any other.
    sales = await run(ScriptedModel(text("Sales")), "which team sells drones? one word")
    assert isinstance(sales.outcome, Reply) and sales.reply == "Sales"


@pytest.mark.parametrize(
    "answer", ['{"name": "Ben Ortiz", "email": "ben@example.com"}', '[{"name": "Kestrel Mini 2", "price": 899}]']
)
async def test_an_answer_that_is_json_with_a_name_is_an_answer_not_a_call(answer: str) -> None:
    model = ScriptedModel(text(answer))
    result = await run(model, "my details as JSON please")
    assert isinstance(result.outcome, Reply) and result.reply == answer and len(model.seen) == 1


async def test_an_answer_wrapped_in_template_tags_reaches_the_customer_as_words() -> None:
    wrapped = '<tool_response>\n"Your order DW-1006 was delivered on the 5th."\n</tool_response>'
    result = await run(ScriptedModel(text(wrapped)), "where is my order DW-1006?")
    assert isinstance(result.outcome, Reply) and result.reply == "Your order DW-1006 was delivered on the 5th."


async def test_the_customers_own_words_given_back_are_not_an_answer() -> None:
    """Qwen2.5-1.5B answered "Which spare battery fits the Osprey Pro 8K?" with that very question."""
    model = ScriptedModel(text("Which spare battery fits the Osprey Pro 8K"), text("The LB-6800P fits it."))
    result = await run(model, "which spare battery fits the  Osprey Pro 8K?")
    assert isinstance(result.outcome, Reply) and result.reply == "The LB-6800P fits it."
    assert "customer's own words" in str(model.seen[1]["messages"][-1]["content"])
    assert all("Which spare battery" not in (m.content or "") for m in result.messages if m.role == "assistant")
    # A greeting answered in kind is an answer.
    hello = await run(ScriptedModel(text("Hi!")), "hi")
    assert isinstance(hello.outcome, Reply) and hello.reply == "Hi!"


async def test_a_call_written_in_the_apis_own_shape_is_made() -> None:
    written = '<tools> {"type": "function", "function": {"name": "transfer_to_sales", "arguments": "{}"}} </tools>'
    model = ScriptedModel(text(written), text("The Kestrel Mini 2 is our lightest drone."))
    result = await run(model, "which drone is lightest?")
    assert [h.to_agent for h in result.handoffs] == ["sales"] and "<tools>" not in result.reply


@pytest.mark.parametrize("written", ["<tools></tools>", "<tool_call>\n</tool_call>", "<tools>not json</tools>"])
async def test_tool_tags_without_a_readable_call_are_asked_again_never_shown(written: str) -> None:
    """A real small model answered `<tools></tools>`: not an answer for the customer."""
    model = ScriptedModel(text(written), text("The LB-6800P fits the Osprey Pro 8K."))
    result = await run(model, "which battery fits the osprey?")
    assert isinstance(result.outcome, Reply) and result.reply == "The LB-6800P fits the Osprey Pro 8K."
    assert "could not be used" in str(model.seen[1]["messages"][-1]["content"])
    assert all("<tool" not in (m.content or "") for m in result.messages)


async def test_a_call_written_as_text_for_a_tool_the_agent_lacks_is_asked_again() -> None:
    bare = '{"name": "lookup_order", "arguments": {"order_id": "DW-1006"}}'  # triage has no lookup_order
    model = ScriptedModel(
        text(bare), calls(("record_customer_name", {"name": "Sam"})), text("Let me bring in support.")
    )
    result = await run(model)
    assert isinstance(result.outcome, Reply) and result.reply == "Let me bring in support."
    # The note goes with the one call after the unusable answer, not with every later one.
    said = ["could not be used" in str(seen["messages"][-1]["content"]) for seen in model.seen]
    assert said == [False, True, False]
    assert all("lookup_order" not in (m.content or "") for m in result.messages)


async def test_a_provider_failure_apologises_and_escalates() -> None:
    model = ScriptedModel(ProviderError("server", "503"))
    result = await run(model)
    assert isinstance(result.outcome, Escalate) and result.outcome.trigger == "provider"
    assert result.reply == CONFIG.texts.get(Text.PROVIDER_FAILURE_MESSAGE)
    assert [c.ok for c in result.llm_calls] == [False]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("no_such_tool", {}, "there is no tool named"),
        ("transfer_to_sales", "{not json", "not valid JSON"),
        ("transfer_to_sales", {"reason": 3}, "invalid arguments"),
    ],
)
async def test_bad_tool_calls_go_back_to_the_model(name: str, arguments: Any, expected: str) -> None:
    model = ScriptedModel(calls((name, arguments)), text("Sorry, let me answer directly."))
    result = await run(model)
    assert result.reply == "Sorry, let me answer directly."
    error = model.seen[1]["messages"][-1]
    assert error["role"] == "tool" and expected.lower() in error["content"].lower()


def _unit(n: int) -> list[Message]:
    """One turn: a customer message, a tool call and its result, and the answer."""
    call = ToolCall(f"c{n}", "lookup_order", "{}")
    return [
        Message("user", f"question {n} " + "x" * 400),
        Message("assistant", None, agent="support", tool_calls=(call,)),
        Message("tool", "result " + "y" * 400, agent="support", tool_call_id=f"c{n}", name="lookup_order"),
        Message("assistant", f"answer {n}", agent="support"),
    ]


def test_the_window_keeps_whole_turns_and_the_newest_one() -> None:
    history = [m for n in range(20) for m in _unit(n)]
    window = build_window(system=["be helpful"], history=history, tools=[], budget=1_000)
    kept = window[1:]
    assert window[0] == {"role": "system", "content": "be helpful"}
    assert kept and kept[0]["role"] == "user"  # starts at a turn's beginning: no orphaned tool result
    assert kept[-1]["content"] == "answer 19" and len(kept) % 4 == 0 and len(kept) < len(history)
    ids = {m.get("tool_call_id") for m in kept if m["role"] == "tool"}
    assert ids == {c["id"] for m in kept for c in m.get("tool_calls", [])}  # every call with its result
    tiny = build_window(system=["s"], history=history, tools=[], budget=1)
    assert [m["content"] for m in tiny[1:]][-1] == "answer 19"  # the newest turn even over budget


def test_the_window_leaves_out_earlier_turns_lookups_made_for_the_model_and_shortens_their_results() -> None:
    prepared = ToolCall(f"{PREPARED}1_support_search", "search_knowledge", '{"query": "warranty?"}')
    own = ToolCall("call_9", "lookup_order", '{"order_id": "DW-1001"}')
    long_result = "Order DW-1001: " + "details " * 200
    history = [
        Message("user", "warranty?"),
        Message("assistant", None, agent="support", tool_calls=(prepared,)),
        Message("tool", "[1] Warranty › 12 months " + "x" * 900, "support", tool_call_id=prepared.id),
        Message("assistant", "12 months [1] Warranty.", agent="support"),
        Message("user", "and DW-1001?"),
        Message("assistant", None, agent="support", tool_calls=(own,)),
        Message("tool", long_result, "support", tool_call_id=own.id),
        Message("assistant", "Delivered.", agent="support"),
        Message("user", "thanks, one more: DW-1002?"),
        Message("assistant", None, agent="support", tool_calls=(replace(prepared, id=f"{PREPARED}3_support_0"),)),
        Message("tool", long_result, "support", tool_call_id=f"{PREPARED}3_support_0"),
    ]
    window = build_window(system=["s"], history=history, tools=[], budget=100_000)
    ids = [c["id"] for m in window for c in m.get("tool_calls") or ()]
    assert ids == ["call_9", f"{PREPARED}3_support_0"]  # the first turn's prepared search is gone, call and result
    assert ids == [m["tool_call_id"] for m in window if m["role"] == "tool"]
    results = [m["content"] for m in window if m["role"] == "tool"]
    assert results[0].endswith(SHORTENED) and len(results[0]) < 300  # an earlier turn's own look-up, cut
    assert results[1] == long_result  # the newest turn's, whole
    assert "12 months [1] Warranty." in [m.get("content") for m in window]


async def test_prepared_calls_have_ids_providers_accept_whatever_the_agent_is_called() -> None:
    """OpenAI and Azure refuse tool-call ids over 40 characters: an operator's long agent name must not matter."""
    roster = default_roster()
    long_name = replace(roster["support"], name="technical_support_for_enterprise_customers", handoffs=())
    model = ScriptedModel(text("It shipped."))
    asker = Author("slack", "T1", "U1", "Ben Ortiz", "ben@example.com")
    result = await run_turn(
        TurnInput(123_456_789, 987_654_321, long_name.name, {}, (Message("user", "where is DW-1002?"),), asker),
        roster=Roster.of((long_name,), entry=long_name.name),
        model=model,
        config=CONFIG,
    )
    [prepared] = [c for m in model.seen[0]["messages"] for c in m.get("tool_calls") or ()]
    assert prepared["function"]["name"] == "lookup_order" and len(prepared["id"]) <= 40
    assert result.tools[0].output.startswith("Order DW-1002 for Ben Ortiz")
