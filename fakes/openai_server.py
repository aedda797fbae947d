"""A scriptable, OpenAI-compatible HTTP server for tests and benchmarks.

It is a real aiohttp server so that the real ``openai.AsyncOpenAI`` client (with
its retries, timeouts, SSE parsing and error mapping) is exercised end to end,
instead of mocking the client and testing our assumptions about it.

Typical use::

    async with FakeOpenAI() as fake:
        fake.script(tools(tool_call("lookup_order", {"id": 7})), reply("Shipped!"))
        client = AsyncOpenAI(api_key="test", base_url=fake.base_url, max_retries=0)
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import math
import re
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from aiohttp import web

FAKE_MODEL = "fake-model"
EMBEDDING_DIM = 64
NO_REPLY_MESSAGE = "fake openai: no scripted reply left"


@dataclass(frozen=True)
class FakeToolCall:
    name: str
    # A str is sent verbatim so tests can deliver malformed JSON to the bot.
    arguments: str | dict[str, Any]
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class FakeReply:
    content: str | None = None
    tool_calls: tuple[FakeToolCall, ...] = ()
    status: int = 200
    delay: float = 0.0
    """Seconds before the answer starts: the time to its first token."""
    word_delay: float = 0.0
    """Seconds the model takes over each word after the first: streamed, the words come a chunk each with this pause
    between them; whole, the answer comes once all are written."""
    error_message: str = "fake openai error"
    cached_tokens: int | None = 0
    """`usage.prompt_tokens_details.cached_tokens`; None leaves `prompt_tokens_details` out, as Ollama does."""


def reply(content: str) -> FakeReply:
    return FakeReply(content=content)


def tool_call(name: str, arguments: str | dict[str, Any] | None = None, id: str | None = None) -> FakeToolCall:
    return FakeToolCall(name=name, arguments={} if arguments is None else arguments, id=id)


def tools(*calls: FakeToolCall, content: str | None = None) -> FakeReply:
    return FakeReply(content=content, tool_calls=calls)


def error(status: int, message: str = "fake openai error") -> FakeReply:
    return FakeReply(status=status, error_message=message)


def cached(tokens: int | None, then: FakeReply) -> FakeReply:
    """`then`, reporting `tokens` of its prompt as served from the provider's prompt cache."""
    return replace(then, cached_tokens=tokens)


def slow(seconds: float, then: FakeReply | None = None) -> FakeReply:
    return replace(then if then is not None else reply(""), delay=seconds)


def slow_words(text: str, first_s: float, each_s: float) -> FakeReply:
    """`text` written as a model writes it: the first word after `first_s`, then one every `each_s`."""
    return FakeReply(content=text, delay=first_s, word_delay=each_s)


def _words(text: str) -> list[str]:
    """`text` as a model streams it: each word with the spaces after it (those before the first, with the first)."""
    return re.findall(r"\s*\S+\s*|\s+", text)


def _shared_start(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slices (C-speed comparisons, not a loop per char)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _text_of(content: Any) -> str:
    # Content may be a plain string or a list of typed parts (multimodal format).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@dataclass(frozen=True)
class RecordedRequest:
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]]:
        return list(self.body.get("tools") or [])

    @property
    def tool_names(self) -> list[str]:
        return [str(t.get("function", {}).get("name", "")) for t in self.tools]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def system(self) -> str:
        for message in self.messages:
            if message.get("role") == "system":
                return _text_of(message.get("content"))
        return ""

    @property
    def last_user(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""


Rule = Callable[[RecordedRequest], FakeReply]


def _ceil_div4(n: int) -> int:
    return math.ceil(n / 4)


def _split(text: str, parts: int) -> list[str]:
    size = max(1, math.ceil(len(text) / parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _error_response(status: int, message: str) -> web.Response:
    # Shaped like OpenAI's errors so the client maps status -> exception class
    # and code that inspects `exc.body` / `exc.code` sees realistic values.
    if status == 429:
        kind, code = "requests", "rate_limit_exceeded"
    elif status >= 500:
        kind, code = "server_error", None
    else:
        kind, code = "invalid_request_error", None
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(payload, status=status)


def _embed(text: str, dim: int) -> list[float]:
    # Hashed bag of words: texts sharing words get similar vectors, which is
    # enough for retrieval tests. blake2b, not hash(), so runs are reproducible.
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
        vec[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    if norm == 0.0:
        # A zero vector would make cosine similarity NaN downstream.
        vec[0] = norm = 1.0
    return [x / norm for x in vec]


def _embedding_inputs(raw: Any) -> list[str]:
    # The API also accepts token ids (list[int] or list[list[int]]).
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        return [" ".join(map(str, raw))]
    if isinstance(raw, list):
        return [x if isinstance(x, str) else " ".join(map(str, x)) for x in raw]
    return []


async def _stream(
    request: web.Request,
    head: dict[str, Any],
    content: str | None,
    calls: list[tuple[str, str, str]],
    finish: str,
    usage: dict[str, Any] | None,
    word_delay: float,
) -> web.StreamResponse:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    words = [chunk({"content": word}) for word in _words(content or "")]
    tail: list[dict[str, Any]] = []  # the calls, the finish and the usage, at once after the words
    for index, (call_id, name, args) in enumerate(calls):
        # OpenAI's shape: the first delta names the call, later ones only
        # carry `index` plus argument fragments that clients must concatenate.
        function = {"name": name, "arguments": ""}
        first = {"index": index, "id": call_id, "type": "function", "function": function}
        tail.append(chunk({"tool_calls": [first]}))
        tail += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}) for piece in _split(args, 3)
        ]
    tail.append(chunk({}, finish))
    if usage is not None:
        tail.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    await send(chunk({"role": "assistant", "content": ""}))
    for n, word in enumerate(words):
        if n and word_delay > 0:
            await asyncio.sleep(word_delay)
        await send(word)
    for payload in tail:
        await send(payload)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


class FakeOpenAI:
    def __init__(self) -> None:
        self.rule: Rule | None = None
        self.requests: list[RecordedRequest] = []
        self.embedding_requests: list[RecordedRequest] = []
        self.embedding_headers: list[dict[str, str]] = []
        self.models_delay = 0.0
        """Seconds GET /models waits before answering: a provider that is slow to say it is there."""
        self.models_status = 200
        """Anything else: GET /models fails with it (a provider that is down)."""
        self.embedding_dim = EMBEDDING_DIM
        """Width of the vectors when the request names no `dimensions` (local servers serve 384, 768, 1024)."""
        self.embeddings_status = 200
        """Anything else: POST /embeddings fails with it (404: a provider without embeddings, like Anthropic's)."""
        self.model_fields: dict[str, Any] = {}
        """Extra fields of the model in GET /models, as vLLM (`max_model_len`) or OpenRouter (`context_length`)."""
        self.ollama: dict[str, Any] | None = None
        """Play Ollama's native API too: {"num_ctx": N} (a Modelfile's parameter, from /api/show),
        {"loaded_context": N} (what /api/ps reports for the loaded model, named `model:latest` as Ollama does),
        {"context_on_load": N} (the context a model gets when POST /api/generate loads it). None: no such API."""
        self.lmstudio: dict[str, Any] | None = None
        """Play LM Studio's GET /api/v0/models: fields of the model's entry, e.g. {"loaded_context_length": N}."""
        self.prompt_cache = False
        """Play a provider's prompt cache in the answers of `rule`: each prompt (tools, then messages, as
        providers render them) reports as cached what it shares from the start with a recent earlier prompt."""
        self._prompts: deque[str] = deque(maxlen=64)
        self._queue: deque[FakeReply] = deque()
        # Ids never repeat over the server's life, so a multi-turn conversation
        # never sees two tool calls with the same id (as with the real API).
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/api/show", self._ollama_show)
        app.router.add_get("/api/ps", self._ollama_ps)
        app.router.add_post("/api/generate", self._ollama_generate)
        app.router.add_get("/api/v0/models", self._lmstudio_models)
        # Cancel handlers whose client went away (e.g. after a client timeout on
        # a slow() reply) and don't wait long on stop: this is a test fixture.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._port = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def calls(self) -> int:
        return len(self.requests)

    def script(self, *replies: FakeReply) -> None:
        self._queue.extend(replies)

    def reset(self) -> None:
        self._queue.clear()
        self.rule = None
        self.requests.clear()
        self.embedding_requests.clear()
        self.embedding_headers.clear()
        self.models_delay, self.models_status = 0.0, 200
        self.embedding_dim, self.embeddings_status, self.model_fields = EMBEDDING_DIM, 200, {}
        self.ollama = self.lmstudio = None
        self.prompt_cache = False
        self._prompts.clear()

    def _next_reply(self, recorded: RecordedRequest) -> FakeReply:
        if self._queue:
            return self._queue.popleft()
        if self.rule is None:
            return error(500, NO_REPLY_MESSAGE)
        try:
            answer = self.rule(recorded)
        except Exception as exc:  # a buggy rule must fail the test loudly, not hang it
            return error(500, f"fake openai: rule raised {exc!r}")
        return cached(self._cached_prefix(recorded), answer) if self.prompt_cache else answer

    def _cached_prefix(self, recorded: RecordedRequest) -> int:
        prompt = json.dumps(recorded.tools) + json.dumps(recorded.messages)
        shared = max((_shared_start(prompt, p) for p in self._prompts), default=0)
        self._prompts.append(prompt)
        return shared // 4

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        recorded = RecordedRequest(body if isinstance(body, dict) else {})
        self.requests.append(recorded)
        if not isinstance(body, dict):
            return _error_response(400, "fake openai: request body is not a JSON object")
        fake = self._next_reply(recorded)
        if fake.delay > 0:
            await asyncio.sleep(fake.delay)
        writing = fake.word_delay * max(0, len(_words(fake.content or "")) - 1)
        if writing > 0 and not recorded.stream and fake.status == 200:
            await asyncio.sleep(writing)  # a whole answer comes once the model has written all of it
        if fake.status != 200:
            return _error_response(fake.status, fake.error_message)
        calls = [(c.id or f"call_{next(self._call_ids)}", c.name, c.arguments_json()) for c in fake.tool_calls]
        completion_chars = len(fake.content or "") + sum(len(n) + len(a) for _, n, a in calls)
        prompt_text = json.dumps(recorded.messages)
        if recorded.tools:
            prompt_text += json.dumps(recorded.tools)
        prompt_tokens = _ceil_div4(len(prompt_text))
        completion_tokens = max(1, _ceil_div4(completion_chars))
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if fake.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": min(fake.cached_tokens, prompt_tokens)}
        head = {
            "id": f"chatcmpl-fake-{next(self._completion_ids)}",
            "created": int(time.time()),
            "model": recorded.model or FAKE_MODEL,
        }
        finish = "tool_calls" if calls else "stop"
        if recorded.stream:
            wants_usage = (recorded.body.get("stream_options") or {}).get("include_usage")
            return await _stream(
                request, head, fake.content, calls, finish, usage if wants_usage else None, fake.word_delay
            )
        message: dict[str, Any] = {"role": "assistant", "content": fake.content, "refusal": None}
        if calls:
            # Like the real API, the key is absent (not []) when there are no calls.
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
            ]
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return web.json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})

    async def _embeddings(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        self.embedding_requests.append(RecordedRequest(body if isinstance(body, dict) else {}))
        self.embedding_headers.append(dict(request.headers))
        if not isinstance(body, dict):
            return _error_response(400, "fake openai: request body is not a JSON object")
        if self.embeddings_status != 200:
            return _error_response(self.embeddings_status, "fake openai: no embeddings here")
        texts = _embedding_inputs(body.get("input"))
        dim = int(body.get("dimensions") or self.embedding_dim)
        # The client asks for base64 by default and decodes it as float32.
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = _embed(text, dim)
            encoded: str | list[float] = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(_ceil_div4(len(t)) for t in texts)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": str(body.get("model") or FAKE_MODEL),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_delay > 0:
            await asyncio.sleep(self.models_delay)
        if self.models_status != 200:
            return _error_response(self.models_status, "fake provider outage")
        model = {"id": FAKE_MODEL, "object": "model", "created": 0, "owned_by": "fake", **self.model_fields}
        return web.json_response({"object": "list", "data": [model]})

    async def _ollama_show(self, request: web.Request) -> web.Response:
        if self.ollama is None:
            return web.Response(status=404, text="404 page not found")
        body = await request.json()
        parameters = f"num_ctx                        {self.ollama['num_ctx']}" if "num_ctx" in self.ollama else ""
        return web.json_response(
            {
                "parameters": parameters,
                "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
                "details": {"family": "llama"},
                "model": body.get("model"),
            }
        )

    async def _ollama_ps(self, request: web.Request) -> web.Response:
        if self.ollama is None:
            return web.Response(status=404, text="404 page not found")
        loaded = self.ollama.get("loaded_context")
        tagged = f"{FAKE_MODEL}:latest"
        models = [{"name": tagged, "model": tagged, "context_length": loaded}] if loaded else []
        return web.json_response({"models": models})

    async def _ollama_generate(self, request: web.Request) -> web.Response:
        if self.ollama is None:
            return web.Response(status=404, text="404 page not found")
        if "context_on_load" in self.ollama:
            self.ollama["loaded_context"] = self.ollama["context_on_load"]
        body = await request.json()
        return web.json_response({"model": body.get("model"), "response": "", "done": True, "done_reason": "load"})

    async def _lmstudio_models(self, request: web.Request) -> web.Response:
        if self.lmstudio is None:
            return web.Response(status=404, text="Unexpected endpoint or method.")
        model = {"id": FAKE_MODEL, "object": "model", "type": "llm", **self.lmstudio}
        return web.json_response({"object": "list", "data": [model]})
