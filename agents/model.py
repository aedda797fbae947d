"""The seam to the LLM: a small `Model` protocol and its Chat Completions implementation.

Chat Completions with tools is the API that OpenAI, Azure, Ollama, vLLM and LiteLLM all serve, so one
implementation reaches all of them through `OPENAI_BASE_URL`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import openai
from openai import AsyncStream

from agents.errors import ProviderError
from agents.messages import ToolCall

log = logging.getLogger(__name__)

TextSink = Callable[[str], Awaitable[None]]
"""Takes the words of an answer as they arrive, in order (a preview: the `ModelResponse` is the answer)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Of the prompt tokens, those served from the provider's prompt cache; None when the provider does not say."""


@dataclass(frozen=True)
class ModelResponse:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    latency_ms: float
    """Wall time of the call as the client saw it, retries included."""
    model: str | None = None
    """Who answered, when not the model asked for: "offline" for the offline stand-in."""
    fallback_from: str | None = None
    """The provider failure this answer stands in for (FallbackModel), so that the failure is recorded too."""


class Model(Protocol):
    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        """`on_text`, when given, is awaited with each piece of the answer's text as the model writes it; a model
        that cannot stream may call it once with the whole text, or not at all. Its failures are not the call's."""
        ...


def _provider_error(exc: openai.OpenAIError) -> ProviderError:
    match exc:
        case openai.APITimeoutError() if (refused := _refused(exc)) is not None:
            return ProviderError("connection", str(refused))
        case openai.APITimeoutError():
            return ProviderError("timeout", str(exc))
        case openai.APIConnectionError():
            return ProviderError("connection", str(exc))
        case openai.RateLimitError():
            return ProviderError("rate_limit", str(exc))
        case openai.APIStatusError() if exc.status_code >= 500:
            return ProviderError("server", str(exc))
        case _:
            return ProviderError("other", str(exc))


def _refused(exc: BaseException) -> BaseException | None:
    """The connection failure behind a "timeout", if it is one: the SDK's aiohttp transport reports every
    `aiohttp.ClientConnectionError` (a refused port, a server gone) as a connect timeout, which would point an
    operator the wrong way. aiohttp's own timeouts are `TimeoutError`s too."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectionError) and not isinstance(seen, TimeoutError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def provider_http(base_url: str | None) -> openai.DefaultAioHttpClient | None:
    """The SDK's aiohttp transport (its documented choice for concurrency) instead of httpx's own pool, which looks
    at every pooled connection (a syscall each) for each request: with hundreds of turns waiting on the provider
    at once that scan measured a quarter of the model call's CPU. None (the SDK's httpx client) for a base URL with
    credentials in it, which httpx sends as Basic authentication and aiohttp refuses beside the API key's header."""
    if base_url is not None and urlsplit(base_url).username is not None:
        return None
    return openai.DefaultAioHttpClient()


class OpenAIChatModel:
    """`AsyncOpenAI` with the timeout and retry count set explicitly. It streams when asked for the words as they
    come (`on_text`), or always with `stream` (some proxies only stream); the response is the same either way."""

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        stream: bool = False,
    ) -> None:
        # Local servers (Ollama, vLLM) need no key, but the SDK insists on one.
        self.client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url,
            timeout=timeout_s,
            max_retries=max_retries,
            http_client=provider_http(base_url),
        )
        self.stream = stream

    async def close(self) -> None:
        await self.client.close()

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        started = time.perf_counter()
        body: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            body["tools"] = tools
        try:
            if self.stream or on_text is not None:
                content, calls, usage = await self._streamed(body, on_text)
            else:
                response = _mapping(await self._post(body, stream=False), "response")
                choices = _list(response.get("choices"), "choices")
                if not choices:
                    raise Malformed("no choices")
                message = _mapping(_mapping(choices[0], "choice").get("message"), "message")
                content = _text(message.get("content"), "content")
                calls = tuple(
                    ToolCall(
                        id=str(c.get("id") or ""),
                        name=str(f.get("name") or ""),
                        arguments=str(f.get("arguments") or ""),
                    )
                    for c in (_mapping(c, "tool call") for c in _list(message.get("tool_calls"), "tool_calls"))
                    if c.get("type", "function") == "function"
                    for f in (_mapping(c.get("function"), "function"),)
                )
                usage = _usage(response.get("usage"))
        except openai.OpenAIError as exc:
            raise _provider_error(exc) from exc
        except ValueError as exc:  # Malformed, or JSON the SDK could not parse (a body cut short, an HTML page)
            raise ProviderError("other", f"the provider's answer is not a chat completion: {exc}") from exc
        return ModelResponse(content, calls, usage, (time.perf_counter() - started) * 1000)

    async def _post(self, body: dict[str, Any], *, stream: bool) -> Any:
        # The client's own `post`, not `chat.completions.create`: `create` walks every message through its
        # typed-dict transformer, which measured 19.6 ms of CPU per call at 100 history messages against
        # 1.8 ms for the same request through `post` (same retries, timeout and error types). The answer comes as
        # the JSON it is (`object`), not as the SDK's models: building a model per streamed chunk was 16% of the
        # bot's CPU under a burst; `_mapping` and friends check the few fields read.
        return await self.client.post(
            "/chat/completions", body=body, cast_to=object, stream=stream, stream_cls=AsyncStream[object]
        )

    async def _streamed(
        self, body: dict[str, Any], on_text: TextSink | None
    ) -> tuple[str | None, tuple[ToolCall, ...], Usage]:
        stream = await self._post(body | {"stream": True, "stream_options": {"include_usage": True}}, stream=True)
        sink = on_text
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        usage = Usage()
        async for raw in stream:
            chunk = _mapping(raw, "chunk")
            if chunk.get("usage") is not None:
                usage = _usage(chunk["usage"])
            for choice in _list(chunk.get("choices"), "choices"):
                delta = _mapping(_mapping(choice, "choice").get("delta"), "delta")
                if piece := _text(delta.get("content"), "content"):
                    text.append(piece)
                    if sink is not None:
                        try:
                            await sink(piece)
                        except Exception:
                            # The preview is the channel's; the answer still comes whole, so the call goes on.
                            log.warning(
                                "the listener to a streamed answer failed; it hears no more of it", exc_info=True
                            )
                            sink = None
                for part in (_mapping(p, "tool call") for p in _list(delta.get("tool_calls"), "tool_calls")):
                    index = part.get("index", 0)
                    if not isinstance(index, int):
                        raise Malformed("a tool call's index is not a number")
                    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    if part.get("id"):
                        call["id"] = str(part["id"])
                    function = _mapping(part.get("function"), "function")
                    if name := _text(function.get("name"), "name"):
                        call["name"] += name
                    if arguments := _text(function.get("arguments"), "arguments"):
                        call["arguments"] += arguments
        tool_calls = tuple(
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
            for i, c in sorted(calls.items())
        )
        return ("".join(text) or None), tool_calls, usage


class Malformed(ValueError):
    """The provider's JSON is not shaped as a chat completion (or a chunk of one)."""


def _mapping(value: Any, what: str) -> dict[str, Any]:
    """`value` as an object; None (a field left out or null) as an empty one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Malformed(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"{what} is not a list")
    return value


def _text(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise Malformed(f"{what} is not text")


def _usage(raw: Any) -> Usage:
    usage = _mapping(raw, "usage")
    if not usage:
        return Usage()
    details = _mapping(usage.get("prompt_tokens_details"), "prompt_tokens_details")
    cached = details.get("cached_tokens")
    return Usage(
        _count(usage.get("prompt_tokens")),
        _count(usage.get("completion_tokens")),
        cached if isinstance(cached, int) else None,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
