"""The chat model's HTTP transport: aiohttp by default, and a base URL with credentials in it still served."""

from __future__ import annotations

import pytest

from agents.model import OpenAIChatModel
from fakes.openai_server import FakeOpenAI, reply

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
