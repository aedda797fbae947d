"""The chat model's HTTP transport: aiohttp by default, and a base URL with credentials in it still served."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from aiohttp import web

from agents.errors import ProviderError
from agents.model import OpenAIChatModel
from fakes.openai_server import FakeOpenAI, reply
from harness.http import serving

pytestmark = pytest.mark.services

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("credentials", ["", "bot:hunter2@"])
async def test_the_model_answers_with_or_without_credentials_in_its_url(fake_llm: FakeOpenAI, credentials: str) -> None:
    """aiohttp refuses credentials in a URL beside the API key's header: such a URL keeps httpx's client, which
    sends them as Basic authentication, as before."""
    fake_llm.script(reply("hello"), reply("streamed hello"))
    url = fake_llm.base_url.replace("http://", f"http://{credentials}")
    model = OpenAIChatModel(api_key="k", base_url=url, timeout_s=5.0, max_retries=0)
    try:
        plain = await model.complete(model="fake-model", messages=USER, tools=[])
        pieces: list[str] = []

        async def heard(text: str) -> None:
            pieces.append(text)

        streamed = await model.complete(model="fake-model", messages=USER, tools=[], on_text=heard)
    finally:
        await model.close()
    assert (plain.content, streamed.content) == ("hello", "streamed hello")
    assert "".join(pieces) == "streamed hello"


@pytest.mark.parametrize(
    ("body", "stream"),
    [
        ({"choices": "none"}, False),
        ({"choices": []}, False),
        ({"choices": [{"message": {"content": 42}}]}, False),
        ('data: {"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]}\n\ndata: [DONE]\n\n', True),
        ('data: {"choices": [{"delta": "words"}]}\n\ndata: [DONE]\n\n', True),
        ("data: <html>busy</html>\n\ndata: [DONE]\n\n", True),
        ('{"choices": [{"message": {"content": "cut sh', False),
    ],
)
async def test_an_answer_not_shaped_as_a_chat_completion_is_the_providers_failure(body: Any, stream: bool) -> None:
    """The answer is read as plain JSON (no SDK models): one of the wrong shape is a ProviderError, which the engine
    handles as any provider failure, never a TypeError deep in a turn."""

    async def answer(request: web.Request) -> web.StreamResponse:
        if isinstance(body, str):
            return web.Response(text=body, content_type="text/event-stream" if stream else "application/json")
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)

    async def heard(text: str) -> None:
        pass

    async with serving(app) as port:
        model = OpenAIChatModel(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5.0, max_retries=0)
        try:
            with pytest.raises(ProviderError) as failed:
                await model.complete(model="m", messages=USER, tools=[], on_text=heard if stream else None)
        finally:
            await model.close()
    assert failed.value.kind == "other" and "not a chat completion" in str(failed.value)


async def test_a_provider_that_refuses_the_connection_is_a_connection_failure_not_a_timeout() -> None:
    """The aiohttp transport reports a refused connection as a connect timeout: the error says what happened."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChatModel(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5.0, max_retries=0)
    try:
        with pytest.raises(ProviderError) as failed:
            await model.complete(model="m", messages=USER, tools=[])
    finally:
        await model.close()
    assert failed.value.kind == "connection" and "Cannot connect" in str(failed.value)
