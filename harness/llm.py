"""The agents against the fake LLM: the model the real OpenAI SDK speaks to `FakeOpenAI` with, and the loop's
configuration naming the fake's model."""

from __future__ import annotations

from typing import Any

from agents.loop import LoopConfig
from agents.model import OpenAIChatModel
from fakes.openai_server import FakeOpenAI

CONFIG = LoopConfig(default_model="fake-model")


OPENED: list[OpenAIChatModel] = []
"""Models made by `make_model` and not closed yet: the tests' fixtures close them after each test (an aiohttp session
left to the garbage collector logs an error into whichever test happens to be running)."""


def make_model(fake: FakeOpenAI, **kwargs: Any) -> OpenAIChatModel:
    """Quick to give up (5 s, no retries), so that a test of a failing provider fails fast."""
    options: dict[str, Any] = {"timeout_s": 5.0, "max_retries": 0} | kwargs
    model = OpenAIChatModel(api_key="test-key", base_url=fake.base_url, **options)
    OPENED.append(model)
    return model


async def close_models() -> None:
    while OPENED:
        await OPENED.pop().close()
