"""The engine streams: the real openai client against the fake over HTTP, the model's words handed on as they arrive
(`Model.complete(on_text=...)`) and the loop's `TextDelta` events, while the answer of record stays the same."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from agents.loop import Event, LoopConfig, Reply, TextDelta, ToolStarted, TurnInput, run_turn
from agents.messages import Message
from agents.model import OpenAIChatModel
from bot.runtime.startup import loop_config
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, reply, slow_words, tool_call, tools
from harness.llm import CONFIG, make_model
from harness.sample import default_roster

USER: Any = [{"role": "user", "content": "where is my order?"}]
NAME_TOOL: Any = {
    "type": "function",
    "function": {"name": "record_customer_name", "parameters": {"type": "object", "properties": {}}},
}
ANSWER = "Your order left the warehouse on Monday and should arrive by Thursday."


@pytest.fixture
async def streaming(fake_llm: FakeOpenAI) -> AsyncIterator[OpenAIChatModel]:
    model = make_model(fake_llm)
    yield model
    await model.close()


class Heard:
    """An `on_text` that keeps what it was given."""

    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def __call__(self, text: str) -> None:
        self.deltas.append(text)


async def test_the_words_arrive_in_order_and_make_the_answer(fake_llm: FakeOpenAI, streaming: OpenAIChatModel) -> None:
    fake_llm.script(reply(ANSWER))
    heard = Heard()
    response = await streaming.complete(model="fake-model", messages=USER, tools=[], on_text=heard)
    assert fake_llm.requests[0].stream  # asked for words, the model streams though `stream` is off
    assert len(heard.deltas) == len(ANSWER.split()) and "".join(heard.deltas) == response.content == ANSWER


async def test_the_first_words_come_long_before_a_whole_answer_would(
    fake_llm: FakeOpenAI, streaming: OpenAIChatModel
) -> None:
    text = " ".join(f"word{n}" for n in range(10))
    fake_llm.script(slow_words(text, 0.0, 0.04), slow_words(text, 0.0, 0.04))
    started = time.perf_counter()
    await streaming.complete(model="fake-model", messages=USER, tools=[])
    whole = time.perf_counter() - started

    first: list[float] = []

    async def on_text(delta: str) -> None:
        first.append(time.perf_counter() - started)

    started = time.perf_counter()
    await streaming.complete(model="fake-model", messages=USER, tools=[], on_text=on_text)
    assert [r.stream for r in fake_llm.requests] == [False, True]
    assert first[0] < whole / 3 and first[-1] > whole / 2  # the words spread over the writing, not at its end


@pytest.mark.parametrize(
    "answer",
    [
        reply(ANSWER),
        tools(tool_call("record_customer_name", {"name": "Sam"}, id="call_a")),
        tools(tool_call("record_customer_name", {"name": "Sam"}, id="call_a"), content="Let me note that down."),
    ],
    ids=["text", "calls", "text then calls"],
)
async def test_a_streamed_response_is_the_one_asked_for_whole(
    fake_llm: FakeOpenAI, streaming: OpenAIChatModel, answer: Any
) -> None:
    fake_llm.script(answer, answer)
    whole = await streaming.complete(model="fake-model", messages=USER, tools=[NAME_TOOL])
    heard = Heard()
    streamed = await streaming.complete(model="fake-model", messages=USER, tools=[NAME_TOOL], on_text=heard)
    assert [r.stream for r in fake_llm.requests] == [False, True]
    assert replace(streamed, latency_ms=0.0) == replace(whole, latency_ms=0.0)
    assert streamed.usage.prompt_tokens > 0 and streamed.usage.completion_tokens > 0  # kept from the last chunk
    assert "".join(heard.deltas) == (answer.content or "")


async def test_a_listener_that_fails_does_not_fail_the_call(
    fake_llm: FakeOpenAI, streaming: OpenAIChatModel, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.script(tools(tool_call("record_customer_name", {"name": "Sam"}), content=ANSWER))
    told: list[str] = []

    async def broken(text: str) -> None:
        told.append(text)
        raise ConnectionResetError("the channel went away")

    with caplog.at_level(logging.WARNING, logger="agents.model"):
        response = await streaming.complete(model="fake-model", messages=USER, tools=[NAME_TOOL], on_text=broken)
    assert response.content == ANSWER and [c.name for c in response.tool_calls] == ["record_customer_name"]
    assert told == ["Your "]  # not called again after it failed
    assert len([r for r in caplog.records if r.name == "agents.model"]) == 1


# --- The loop ---------------------------------------------------------------------------------------------------


def turn(message: str) -> TurnInput:
    return TurnInput(1, 1, "triage", {}, (Message("user", message),))


async def run(model: OpenAIChatModel, config: LoopConfig, *, listen: bool = True) -> tuple[Any, list[Event]]:
    events: list[Event] = []

    async def on_event(event: Event) -> None:
        events.append(event)

    result = await run_turn(
        turn("I'm Sam, where is my order?"),
        roster=default_roster(),
        model=model,
        config=config,
        on_event=on_event if listen else None,
    )
    return result, events


async def test_the_loop_passes_each_calls_words_on_numbered_by_call(
    fake_llm: FakeOpenAI, streaming: OpenAIChatModel
) -> None:
    fake_llm.script(
        tools(tool_call("record_customer_name", {"name": "Sam"}), content="One moment while I note that."),
        reply("Thanks, Sam. Which order do you mean?"),
    )
    result, events = await run(streaming, CONFIG)
    assert result.outcome == Reply("Thanks, Sam. Which order do you mean?")
    assert all(r.stream for r in fake_llm.requests)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert {d.agent for d in deltas} == {"triage"}
    by_call = {n: "".join(d.text for d in deltas if d.call == n) for n in (1, 2)}
    assert by_call == {1: "One moment while I note that.", 2: "Thanks, Sam. Which order do you mean?"}
    assert len(deltas) == len(by_call[1].split()) + len(by_call[2].split())
    # The first call's words, then its tool, then the answer's words, then the answer.
    kinds = [
        f"text{e.call}" if isinstance(e, TextDelta) else type(e).__name__
        for e in events
        if isinstance(e, TextDelta | ToolStarted | Reply)
    ]
    assert [k for n, k in enumerate(kinds) if n == 0 or kinds[n - 1] != k] == ["text1", "ToolStarted", "text2", "Reply"]


async def test_a_call_written_as_text_is_never_previewed(fake_llm: FakeOpenAI, streaming: OpenAIChatModel) -> None:
    written = '<tool_call>{"name": "record_customer_name", "arguments": {"name": "Sam"}}</tool_call>'
    fake_llm.script(reply(written), reply("Thanks, Sam."))
    result, events = await run(streaming, CONFIG)
    assert result.reply == "Thanks, Sam." and [r.call.name for r in result.tools] == ["record_customer_name"]
    assert [(e.call, e.text) for e in events if isinstance(e, TextDelta)] == [(2, "Thanks, "), (2, "Sam.")]


@pytest.mark.parametrize("stream, listen", [(False, True), (True, False)], ids=["streaming off", "no listener"])
async def test_no_stream_is_asked_for_without_a_listener_or_with_streaming_off(
    fake_llm: FakeOpenAI, streaming: OpenAIChatModel, stream: bool, listen: bool
) -> None:
    fake_llm.script(reply(ANSWER))
    result, events = await run(streaming, replace(CONFIG, stream=stream), listen=listen)
    assert result.reply == ANSWER
    assert [r.stream for r in fake_llm.requests] == [False]
    assert not any(isinstance(e, TextDelta) for e in events)


async def test_openai_stream_streams_without_a_listener(fake_llm: FakeOpenAI) -> None:
    model = make_model(fake_llm, stream=True)
    try:
        fake_llm.script(reply(ANSWER))
        result, _ = await run(model, CONFIG, listen=False)
    finally:
        await model.close()
    assert result.reply == ANSWER and [r.stream for r in fake_llm.requests] == [True]


def test_stream_answers_sets_the_loops_streaming() -> None:
    assert loop_config(Settings(_env_file=None)).stream  # type: ignore[call-arg]
    assert not loop_config(Settings(_env_file=None, stream_answers=False)).stream  # type: ignore[call-arg]
