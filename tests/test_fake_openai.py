"""Tests for the fake OpenAI server, driven through the real openai client."""

from __future__ import annotations

import json
import math
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from fakes.openai_server import (
    NO_REPLY_MESSAGE,
    FakeOpenAI,
    RecordedRequest,
    error,
    reply,
    slow,
    tool_call,
    tools,
)

pytestmark = pytest.mark.services  # every test serves the fake

LOOKUP_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
    },
}
USER: Any = [{"role": "user", "content": "hi"}]


def client_for(fake: FakeOpenAI, timeout: float = 5.0) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test", base_url=fake.base_url, max_retries=0, timeout=timeout)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.asyncio
async def test_scripted_text_reply() -> None:
    async with FakeOpenAI() as fake:
        fake.script(reply("Hello there"))
        resp = await client_for(fake).chat.completions.create(model="gpt-x", messages=USER)
    choice = resp.choices[0]
    assert choice.message.content == "Hello there"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert resp.model == "gpt-x"
    assert resp.usage is not None
    prompt_chars = len(json.dumps(fake.requests[0].messages))
    assert resp.usage.prompt_tokens == math.ceil(prompt_chars / 4)
    assert resp.usage.completion_tokens == math.ceil(len("Hello there") / 4)
    assert resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.asyncio
async def test_scripted_tool_calls() -> None:
    async with FakeOpenAI() as fake:
        fake.script(
            tools(
                tool_call("lookup_order", {"id": 7}),
                tool_call("escalate", id="call_custom"),
                content="Checking",
            )
        )
        resp = await client_for(fake).chat.completions.create(model="m", messages=USER, tools=[LOOKUP_TOOL])
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking"
    assert message.tool_calls is not None
    first, second = message.tool_calls
    assert first.type == "function" and second.type == "function"
    assert first.function.name == "lookup_order"
    assert json.loads(first.function.arguments) == {"id": 7}
    assert first.id == "call_1"
    assert second.function.name == "escalate"
    assert second.function.arguments == "{}"
    assert second.id == "call_custom"


@pytest.mark.asyncio
async def test_invalid_json_arguments_arrive_verbatim() -> None:
    async with FakeOpenAI() as fake:
        fake.script(tools(tool_call("lookup_order", '{"id": 7,')))
        resp = await client_for(fake).chat.completions.create(model="m", messages=USER)
    calls = resp.choices[0].message.tool_calls
    assert calls is not None and calls[0].type == "function"
    assert calls[0].function.arguments == '{"id": 7,'
    assert resp.choices[0].message.content is None


@pytest.mark.asyncio
async def test_streaming_accumulates_content_tool_calls_and_usage() -> None:
    args = {"id": 12345, "note": "a fairly long argument string to fragment"}
    async with FakeOpenAI() as fake:
        fake.script(tools(tool_call("lookup_order", args), tool_call("escalate", "{}"), content="One moment please"))
        stream = await client_for(fake).chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        content = ""
        calls: dict[int, dict[str, str]] = {}
        fragments: dict[int, int] = {}
        finish_reason = None
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
                assert chunk.choices == []
            for choice in chunk.choices:
                content += choice.delta.content or ""
                finish_reason = choice.finish_reason or finish_reason
                for delta in choice.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, {"id": "", "name": "", "args": ""})
                    entry["id"] += delta.id or ""
                    if delta.function is not None:
                        entry["name"] += delta.function.name or ""
                        entry["args"] += delta.function.arguments or ""
                        if delta.function.arguments:
                            fragments[delta.index] = fragments.get(delta.index, 0) + 1
    assert content == "One moment please"
    assert finish_reason == "tool_calls"
    assert calls[0]["name"] == "lookup_order"
    assert json.loads(calls[0]["args"]) == args
    assert calls[0]["id"].startswith("call_")
    assert calls[1] == {"id": calls[1]["id"], "name": "escalate", "args": "{}"}
    assert fragments[0] >= 2 and fragments[1] >= 2
    assert usage is not None and usage.completion_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert fake.requests[0].stream


@pytest.mark.asyncio
async def test_streaming_error_is_plain_http_error() -> None:
    async with FakeOpenAI() as fake:
        fake.script(error(503, "overloaded"))
        with pytest.raises(openai.InternalServerError, match="overloaded"):
            await client_for(fake).chat.completions.create(model="m", messages=USER, stream=True)


@pytest.mark.asyncio
async def test_error_statuses_map_to_client_exceptions() -> None:
    async with FakeOpenAI() as fake:
        fake.script(error(500, "boom"), error(429, "slow down"))
        client = client_for(fake)
        with pytest.raises(openai.InternalServerError, match="boom"):
            await client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.RateLimitError) as rate_limited:
            await client.chat.completions.create(model="m", messages=USER)
    assert rate_limited.value.code == "rate_limit_exceeded"
    assert fake.calls == 2


@pytest.mark.asyncio
async def test_slow_reply_triggers_client_timeout() -> None:
    async with FakeOpenAI() as fake:
        fake.script(slow(1.0, reply("too late")), reply("on time"))
        client = client_for(fake, timeout=0.2)
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=USER)
        resp = await client.chat.completions.create(model="m", messages=USER)
    assert resp.choices[0].message.content == "on time"


@pytest.mark.asyncio
async def test_rule_used_when_queue_empty() -> None:
    def echo(request: RecordedRequest) -> Any:
        return reply(f"echo: {request.last_user}")

    async with FakeOpenAI() as fake:
        fake.script(reply("scripted"))
        fake.rule = echo
        client = client_for(fake)
        first = await client.chat.completions.create(model="m", messages=USER)
        second = await client.chat.completions.create(model="m", messages=USER)
    assert first.choices[0].message.content == "scripted"
    assert second.choices[0].message.content == "echo: hi"


@pytest.mark.asyncio
async def test_no_reply_left_fails_loudly_and_is_recorded() -> None:
    async with FakeOpenAI() as fake:
        with pytest.raises(openai.InternalServerError, match=NO_REPLY_MESSAGE):
            await client_for(fake).chat.completions.create(model="m", messages=USER)
    assert fake.calls == 1


@pytest.mark.asyncio
async def test_requests_are_recorded() -> None:
    async with FakeOpenAI() as fake:
        fake.script(reply("a"))
        await client_for(fake).chat.completions.create(
            model="gpt-test",
            messages=[
                {"role": "system", "content": "You are support."},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "second"}]},
            ],
            tools=[LOOKUP_TOOL],
        )
        recorded = fake.requests[0]
        assert recorded.model == "gpt-test"
        assert recorded.tool_names == ["lookup_order"]
        assert recorded.system == "You are support."
        assert recorded.last_user == "second"
        assert not recorded.stream
        assert len(recorded.messages) == 4
        fake.rule = lambda _: reply("x")
        fake.script(reply("y"))
        fake.reset()
        assert fake.calls == 0 and fake.rule is None
        with pytest.raises(openai.InternalServerError):
            await client_for(fake).chat.completions.create(model="m", messages=USER)


@pytest.mark.asyncio
async def test_embeddings_are_deterministic() -> None:
    texts = ["where is my order", "where is my order", "my order is late", "reset my password"]
    async with FakeOpenAI() as fake:
        client = client_for(fake)
        single = await client.embeddings.create(model="emb", input="where is my order")
        many = await client.embeddings.create(model="emb", input=texts)
        floats = await client.embeddings.create(model="emb", input=texts, encoding_format="float")
    assert len(single.data) == 1 and len(many.data) == 4
    vectors = [d.embedding for d in many.data]
    assert all(len(v) == 64 for v in vectors)
    assert vectors[0] == vectors[1]
    assert single.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    for as_float, vector in zip(floats.data, vectors, strict=True):
        assert as_float.embedding == pytest.approx(vector, abs=1e-6)
    assert cosine(vectors[0], vectors[0]) == pytest.approx(1.0, abs=1e-5)
    assert cosine(vectors[0], vectors[2]) > cosine(vectors[0], vectors[3])
    assert many.usage.prompt_tokens == many.usage.total_tokens > 0
    assert len(fake.embedding_requests) == 3 and fake.calls == 0


@pytest.mark.asyncio
async def test_models_endpoint() -> None:
    async with FakeOpenAI() as fake:
        models = [m.id async for m in client_for(fake).models.list()]
    assert models == ["fake-model"]
