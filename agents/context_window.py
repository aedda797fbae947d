"""How many tokens the provider's model accepts, where the provider says so, so that the history sent to it
(`CONTEXT_TOKEN_BUDGET`) fits.

OpenAI's API does not say (its models take far more than the default budget). Among compatible servers:
Ollama serves a context far smaller than the model's maximum unless told otherwise (its native `/api/show`
names a Modelfile's `num_ctx`, `/api/ps` the loaded model's context); vLLM lists `max_model_len` in
`/models`, OpenRouter, LM Studio and others `context_length` or similar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp

OLLAMA_DEFAULT = 4096
"""Ollama's default context on a machine with under 24 GiB of VRAM (its docs: "Context length")."""
RESERVE = 2048
"""Tokens kept free of history: instructions, shared context, tool schemas and the reply."""
MIN_HISTORY = 512
_MODEL_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length", "max_input_tokens")


@dataclass(frozen=True)
class ContextWindow:
    tokens: int
    source: str
    """Where the figure comes from, for the start-up log."""
    ollama: bool = False


def history_budget(configured: int, window: ContextWindow | None) -> int:
    """The history budget that fits the window, never above what is configured."""
    if window is None:
        return configured
    return max(MIN_HISTORY, min(configured, window.tokens - RESERVE))


async def context_window(
    *, base_url: str | None, api_key: str | None, model: str, timeout_s: float = 5.0
) -> ContextWindow | None:
    """The model's context as the provider serves it, or None when it does not say (or does not answer)."""
    if not base_url:
        return None
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        try:
            return await _ollama(http, root, model) or await _listed(http, base, model)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


async def _get(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> dict[str, Any] | None:
    """The JSON object answered with 200, else None."""
    async with http.request(method, url, **kwargs) as response:
        if response.status != 200:
            return None
        body = await response.json(content_type=None)
        return body if isinstance(body, dict) else None


async def _ollama(http: aiohttp.ClientSession, root: str, model: str) -> ContextWindow | None:
    info = await _get(http, "POST", f"{root}/api/show", json={"model": model})
    if info is None or "model_info" not in info:
        return None
    if found := re.search(r"\bnum_ctx\s+(\d+)", str(info.get("parameters") or "")):
        return ContextWindow(int(found[1]), f"the Modelfile's num_ctx of {model}", ollama=True)
    running = await _get(http, "GET", f"{root}/api/ps") or {}
    for entry in running.get("models") or []:
        if model in (entry.get("name"), entry.get("model")) and entry.get("context_length"):
            return ContextWindow(int(entry["context_length"]), f"the loaded context of {model} (ollama ps)", True)
    return ContextWindow(OLLAMA_DEFAULT, "Ollama's default context (not loaded yet, no num_ctx set)", ollama=True)


async def _listed(http: aiohttp.ClientSession, base: str, model: str) -> ContextWindow | None:
    listed = await _get(http, "GET", f"{base}/models") or {}
    for entry in listed.get("data") or []:
        if isinstance(entry, dict) and entry.get("id") == model:
            for field in _MODEL_FIELDS:
                if isinstance(entry.get(field), int) and entry[field] > 0:
                    return ContextWindow(int(entry[field]), f"{field} of {model} in GET /models")
    return None
