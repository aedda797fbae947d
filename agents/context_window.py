"""How many tokens the provider's model accepts, where the provider says so, so that the history sent to it
(`CONTEXT_TOKEN_BUDGET`) fits.

OpenAI's API does not say (its models take far more than the default budget). Among compatible servers:
Ollama serves a context far smaller than the model's maximum unless told otherwise, and cuts longer prompts
from the front: its native `/api/show` names a Modelfile's `num_ctx`, and `/api/ps` the context of a loaded
model (what OLLAMA_CONTEXT_LENGTH or the machine's VRAM made it), so a model not loaded yet is loaded first.
vLLM lists `max_model_len` in `/models`, OpenRouter `context_length`; LM Studio says it in `/api/v0/models`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

RESERVE = 2048
"""Tokens kept free of history: instructions, shared context, tool schemas and the reply."""
LOAD_TIMEOUT_S = 60.0
"""Loading a model into Ollama (to learn the context it runs with) may take a while from a slow disk."""
log = logging.getLogger(__name__)
_MODEL_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length", "max_input_tokens")


@dataclass(frozen=True)
class ContextWindow:
    tokens: int
    source: str
    """Where the figure comes from, for the start-up log."""
    ollama: bool = False


def history_budget(configured: int, window: ContextWindow | None) -> int:
    """The history budget that fits the window, never above what is configured (a window too small for the
    reserve still gets a quarter of it for history)."""
    if window is None:
        return configured
    return min(configured, max(window.tokens - RESERVE, window.tokens // 4))


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
            return await _ollama(http, root, model) or await _listed(http, base, root, model)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


async def _get(http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> dict[str, Any] | None:
    """The JSON object answered with 200, else None."""
    async with http.request(method, url, **kwargs) as response:
        if response.status != 200:
            return None
        body = await response.json(content_type=None)
        return body if isinstance(body, dict) else None


def _tagged(name: str) -> str:
    """Ollama names a model `name:tag`; a name without a tag means `:latest`."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


async def _ollama(http: aiohttp.ClientSession, root: str, model: str) -> ContextWindow | None:
    info = await _get(http, "POST", f"{root}/api/show", json={"model": model})
    if info is None or "model_info" not in info:
        return None
    if found := re.search(r"\bnum_ctx\s+(\d+)", str(info.get("parameters") or "")):
        return ContextWindow(int(found[1]), f"the Modelfile's num_ctx of {model}", ollama=True)
    if loaded := await _ollama_loaded(http, root, model):
        return loaded
    # Not loaded: an empty generate request loads it, with the context the server gives it.
    timeout = aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)
    await _get(http, "POST", f"{root}/api/generate", json={"model": model}, timeout=timeout)
    if loaded := await _ollama_loaded(http, root, model):
        return loaded
    log.warning(
        "Ollama did not say what context %s runs with: CONTEXT_TOKEN_BUDGET is kept. Ollama's default is 4,096 "
        "tokens below 24 GiB of VRAM; raise it with OLLAMA_CONTEXT_LENGTH or a Modelfile's num_ctx",
        model,
    )
    return None


async def _ollama_loaded(http: aiohttp.ClientSession, root: str, model: str) -> ContextWindow | None:
    running = await _get(http, "GET", f"{root}/api/ps") or {}
    for entry in running.get("models") or []:
        names = {_tagged(str(entry.get(key) or "")) for key in ("name", "model")}
        if _tagged(model) in names and entry.get("context_length"):
            return ContextWindow(int(entry["context_length"]), f"the loaded context of {model} (ollama ps)", True)
    return None


async def _listed(http: aiohttp.ClientSession, base: str, root: str, model: str) -> ContextWindow | None:
    listed = await _get(http, "GET", f"{base}/models") or {}
    for entry in listed.get("data") or []:
        if isinstance(entry, dict) and entry.get("id") == model:
            for field in _MODEL_FIELDS:
                if isinstance(entry.get(field), int) and entry[field] > 0:
                    return ContextWindow(int(entry[field]), f"{field} of {model} in GET /models")
    studio = await _get(http, "GET", f"{root}/api/v0/models") or {}  # LM Studio's own API
    for entry in studio.get("data") or []:
        if isinstance(entry, dict) and entry.get("id") == model:
            for field in ("loaded_context_length", "max_context_length"):
                if isinstance(entry.get(field), int) and entry[field] > 0:
                    return ContextWindow(int(entry[field]), f"{field} of {model} (LM Studio)")
    return None
