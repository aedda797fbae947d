"""No optional part stops the bot: embeddings from any OpenAI-compatible provider (their width learned, or asked
for), from a separate embeddings server, or from none at all (full-text search, said plainly, and vectors made
later); the local model shipped with the package; the sample's shipped vectors; the history budget fitted to
the provider's context. Providers are the fake OpenAI server over HTTP, Postgres is real."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.context_window import RESERVE
from agents.db import models as m
from agents.knowledge.embedders import OpenAIEmbedder, Precomputed, probe, text_key
from agents.knowledge.local import MODEL_DIR, TABLE, LocalEmbedder, Weights
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import NOTHING_FOUND, search_knowledge_tool
from agents.tools import ToolContext
from bot.runtime import startup as runtime
from bot.runtime.startup import ensure_sample_knowledge, fitted_budget, knowledge_base
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import bot_settings, serving
from harness.sample import SAMPLE_KNOWLEDGE, SAMPLE_VECTORS

Sessions = async_sessionmaker[AsyncSession]
SUPPORT = SAMPLE_KNOWLEDGE / "support"
QUESTION = "how long is the warranty on a drone"


def provider(fake: FakeOpenAI, **values: Any) -> Settings:
    """Settings as an operator writes them: chat (and by default embeddings) from the fake provider."""
    base: dict[str, Any] = {
        "openai_api_key": "sk-chat",
        "openai_base_url": fake.base_url,
        "openai_model": "fake-model",
        "openai_max_retries": 0,
    }
    return Settings(_env_file=None, **(base | values))  # type: ignore[call-arg]


async def chunk_dims(sessions: Sessions) -> list[int | None]:
    async with sessions() as s:
        return list((await s.scalars(select(m.KnowledgeChunk.dim).distinct())).all())


async def test_a_provider_with_384_dimensions_is_used_as_it_is(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    """The reported failure: a compatible server serving 384-wide vectors under the default model name."""
    fake_llm.embedding_dim = 384
    kb = await knowledge_base(provider(fake_llm), sessions)
    assert kb.unavailable is None and kb.embedder.dim == 384
    assert "dimensions" not in fake_llm.embedding_requests[0].body  # nothing asked: the width is learned
    await kb.ingest([SUPPORT], collection="support", root=SAMPLE_KNOWLEDGE)
    assert await chunk_dims(sessions) == [384]
    status = await kb.status()
    assert status.search == "hybrid" and status.dim == 384 and not status.problems
    hits = await kb.search(QUESTION, collections=["support"])
    assert hits and hits[0].similarity is not None


async def test_embeddings_dim_is_asked_of_the_model(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    kb = await knowledge_base(provider(fake_llm, embeddings_dim=32), sessions)
    assert kb.embedder.dim == 32 and fake_llm.embedding_requests[0].body["dimensions"] == 32


async def test_embeddings_from_their_own_server_and_key(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    """Chat from one place, embeddings from another (EMBEDDINGS_BASE_URL, EMBEDDINGS_API_KEY, EMBEDDINGS_MODEL)."""
    async with FakeOpenAI() as embeddings_server:
        settings = provider(
            fake_llm,
            embeddings_base_url=embeddings_server.base_url,
            embeddings_api_key="sk-embeddings",
            embeddings_model="nomic-embed-text",
        )
        kb = await knowledge_base(settings, sessions)
        await kb.search(QUESTION)
        assert kb.unavailable is None and kb.embedder.name == "openai:nomic-embed-text"
        assert fake_llm.embedding_requests == []
        assert {r.model for r in embeddings_server.embedding_requests} == {"nomic-embed-text"}
        assert embeddings_server.embedding_headers[0]["Authorization"] == "Bearer sk-embeddings"


async def test_the_chat_key_never_goes_to_another_embeddings_server(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    async with FakeOpenAI() as embeddings_server:
        settings = provider(fake_llm, embeddings_base_url=embeddings_server.base_url)
        kb = await knowledge_base(settings, sessions)
        assert kb.unavailable is None
        assert "sk-chat" not in str(embeddings_server.embedding_headers)


async def test_credentials_in_the_url_are_not_shown(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    fake_llm.embeddings_status = 404
    url = fake_llm.base_url.replace("http://", "http://bot:hunter2@") + "?api-key=secret2"
    kb = await knowledge_base(provider(fake_llm, embeddings="openai", embeddings_base_url=url), sessions)
    shown = str(await kb.status())
    assert kb.unavailable is not None and "has no embeddings endpoint" in shown
    assert "hunter2" not in shown and "secret2" not in shown


async def test_a_provider_without_embeddings_leaves_full_text_search(
    sessions: Sessions, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Anthropic's compatibility endpoint has no embeddings: the knowledge base is stored without vectors and
    searched by full text, the log says what is wrong and how to fix it, and the agents' tool still finds."""
    fake_llm.embeddings_status = 404
    with caplog.at_level(logging.WARNING, logger="bot.runtime.startup"):
        kb = await knowledge_base(provider(fake_llm, embeddings="openai"), sessions)
    assert kb.unavailable is not None and not kb.unavailable.retry
    assert "has no embeddings endpoint" in caplog.text and "EMBEDDINGS=local" in caplog.text
    await ensure_sample_knowledge(kb)
    assert await chunk_dims(sessions) == [None]
    status = await kb.status()
    assert status.search == "full-text" and "no embeddings endpoint" in status.problems[0]
    hits = await kb.search(QUESTION, collections=["support"])
    assert hits and all(h.similarity is None and not h.vector_searched for h in hits)
    tool = search_knowledge_tool(kb, collections=["support"])
    context = ToolContext(1, None, "support", {})
    answer = await tool.invoke(context, json.dumps({"query": QUESTION}))
    assert answer != NOTHING_FOUND and "Warranty" in str(answer)
    # One shared word is no answer: a question the documents do not answer still finds nothing.
    for unrelated in ("is the stock market open today", "write me a poem about my cat"):
        assert await tool.invoke(context, json.dumps({"query": unrelated})) == NOTHING_FOUND


async def test_auto_takes_the_local_model_when_the_provider_has_no_embeddings(
    sessions: Sessions, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """EMBEDDINGS=auto with a chat provider that serves no embeddings (Anthropic's, Groq's): the model shipped
    with the bot, said in the log, rather than full text."""
    fake_llm.embeddings_status = 404
    gc.collect()  # what earlier tests in this process left unclosed is not this test's
    await asyncio.sleep(0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bot.runtime.startup"):
        kb = await knowledge_base(provider(fake_llm), sessions)
    assert kb.unavailable is None and [m.name for m in kb.models] == [LocalEmbedder.name, MultilingualEmbedder.name]
    assert "Using the local model instead" in caplog.text
    # The provider's client it probed with is closed, not left to the garbage collector (which logs an error).
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await asyncio.sleep(0)
    assert "Unclosed" not in caplog.text


async def test_an_embedder_failing_during_the_first_start_does_not_stop_it(
    sessions: Sessions, fake_llm: FakeOpenAI
) -> None:
    """The probe passed, then the provider fails (429, 5xx) while the sample is stored: the sample is kept
    without vectors, searched by full text, and the failure is shown."""
    kb = await knowledge_base(provider(fake_llm), sessions)
    fake_llm.embeddings_status = 503
    await ensure_sample_knowledge(kb)
    await kb.settle()
    status = await kb.status()
    assert status.search == "full-text" and status.unembedded == 121 and "failed" in status.problems[0]
    assert (await kb.search(QUESTION, collections=["support"]))[0].text_match


async def test_vectors_are_made_once_the_embedder_works(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    """A provider that fails after start-up (503): full text meanwhile, probed again in the background by the
    searches themselves (none waits for it); once it answers, what was stored without vectors is embedded and
    search is hybrid again, with no restart."""
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    embedder = OpenAIEmbedder(client=client, model="fake-embed")

    async def reprobe() -> Any:
        return await probe(embedder, where="the fake")

    kb = KnowledgeBase(sessions=sessions, embedder=embedder, reprobe=reprobe, reprobe_every_s=0)
    assert await reprobe() is None  # the width is known: the collection records it
    await kb.ingest([SUPPORT / "warranty.md"], collection="support", root=SAMPLE_KNOWLEDGE)
    fake_llm.embeddings_status = 503
    await kb.ingest([SUPPORT / "shipping.md"], collection="support", root=SAMPLE_KNOWLEDGE)
    assert kb.unavailable is not None and kb.unavailable.why == "lost"
    assert set(await chunk_dims(sessions)) == {64, None}
    hits = await kb.search("when will my parcel arrive", collections=["support"])
    assert hits and not any(h.vector_searched for h in hits)  # full text, and no wait for the probe
    fake_llm.embeddings_status = 200
    await kb.search(QUESTION, collections=["support"])  # starts the probe in the background
    await kb.settle()
    assert kb.unavailable is None and await chunk_dims(sessions) == [64]
    hits = await kb.search(QUESTION, collections=["support"])
    assert hits[0].similarity is not None and hits[0].vector_searched
    await client.close()


async def test_a_collection_of_another_width_is_searched_by_text_until_reembedded(
    sessions: Sessions, fake_llm: FakeOpenAI
) -> None:
    old = await knowledge_base(provider(fake_llm, embeddings_dim=48), sessions)
    await old.ingest([SUPPORT], collection="support", root=SAMPLE_KNOWLEDGE)
    kb = await knowledge_base(provider(fake_llm), sessions)  # the operator dropped EMBEDDINGS_DIM: 64 now
    status = await kb.status()
    assert status.search == "full-text" and "kb reembed --collection support" in status.problems[0]
    hits = await kb.search(QUESTION, collections=["support"])
    assert hits and not hits[0].vector_searched
    assert await kb.reembed("support") > 0
    assert (await kb.status()).search == "hybrid" and await chunk_dims(sessions) == [64]


async def test_a_missing_local_model_leaves_full_text_search(sessions: Sessions, tmp_path: Path) -> None:
    local = LocalEmbedder(path=tmp_path / "gone")
    kb = KnowledgeBase(sessions=sessions, embedder=local, unavailable=await local.load())
    assert kb.unavailable is not None and "could not be loaded" in kb.unavailable.problem
    await kb.ingest([SUPPORT], collection="support", root=SAMPLE_KNOWLEDGE)
    found = await search_knowledge_tool(kb, collections=["support"]).invoke(
        ToolContext(1, None, "support", {}), json.dumps({"query": QUESTION})
    )
    assert "Warranty" in str(found)


async def test_collections_never_embedded_go_to_the_embedder_that_works(
    sessions: Sessions, fake_llm: FakeOpenAI
) -> None:
    """First start with a provider without embeddings, then the operator follows the advice (EMBEDDINGS=local):
    the never-embedded sample is embedded by the local model, not left to the provider that never worked."""
    fake_llm.embeddings_status = 404
    first = await knowledge_base(provider(fake_llm, embeddings="openai"), sessions)
    await ensure_sample_knowledge(first)
    kb = await knowledge_base(provider(fake_llm, embeddings="local"), sessions)
    await ensure_sample_knowledge(kb)
    await kb.settle()
    status = await kb.status()
    assert status.search == "hybrid" and status.unembedded == 0 and not status.problems
    assert await chunk_dims(sessions) == [384]


async def test_local_chooses_per_collection_and_the_others_one_model_for_all(
    sessions: Sessions, fake_llm: FakeOpenAI
) -> None:
    chosen = await knowledge_base(provider(fake_llm, embeddings="local"), sessions)
    english = await knowledge_base(provider(fake_llm, embeddings="local-english"), sessions)
    multilingual = await knowledge_base(provider(fake_llm, embeddings="local-multilingual"), sessions)
    assert chosen.unavailable is None and isinstance(chosen.english, LocalEmbedder)
    assert isinstance(chosen.embedder, MultilingualEmbedder) and chosen.embedder._model is None  # not loaded yet
    assert english.unavailable is None and [type(m) for m in english.models] == [LocalEmbedder]
    assert multilingual.unavailable is None and [type(m) for m in multilingual.models] == [MultilingualEmbedder]
    assert fake_llm.embedding_requests == []


async def test_embeddings_none_is_full_text_by_choice(sessions: Sessions, fake_llm: FakeOpenAI) -> None:
    kb = await knowledge_base(provider(fake_llm, embeddings="none"), sessions)
    assert kb.unavailable is not None and fake_llm.embedding_requests == []


# --- the sample's shipped vectors ----------------------------------------------------------------------------


class Counting:
    """The local model, counting the passages it is asked to embed."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.dim, self.texts = inner, inner.name, inner.dim, 0
        self.min_similarity = inner.min_similarity

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.texts += len(texts)
        vectors: list[list[float]] = await self.inner.embed(texts)
        return vectors

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = await self.inner.embed_query(texts)
        return vectors


def test_the_shipped_vectors_cover_every_passage_of_the_sample() -> None:
    """Fails when the sample (or its chunking) changes without `python scripts/sample_vectors.py`."""
    from scripts.sample_vectors import sample_texts

    stored = np.load(SAMPLE_VECTORS)
    assert str(stored["embedder"]) == LocalEmbedder.name  # the sample is English: the model EMBEDDINGS=local chooses
    assert stored["vectors"].shape[1] == LocalEmbedder.dim
    assert {text_key(t) for t in sample_texts()} <= {str(k) for k in stored["keys"]}


async def test_first_start_uses_the_shipped_vectors_and_shows_progress(
    sessions: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    counting, multilingual = Counting(LocalEmbedder()), MultilingualEmbedder()
    kb = KnowledgeBase(sessions=sessions, embedder=multilingual, english=counting)
    with caplog.at_level(logging.INFO, logger="bot.runtime.startup"):
        await ensure_sample_knowledge(kb)
    await kb.settle()
    assert counting.texts == 3  # the check against the model; the 121 passages came with the sample
    assert "knowledge 17/17" in caplog.text and "shipped vectors" in caplog.text
    assert await chunk_dims(sessions) == [384]
    async with sessions() as s:
        assert await s.scalar(select(func.count()).select_from(m.KnowledgeChunk)) == 121
    assert (await kb.search("spare battery for the harrier", collections=["catalogue"]))[0].similarity
    assert multilingual._model is None  # an English knowledge base never loads the multilingual model


async def test_shipped_vectors_of_another_model_or_damaged_are_not_used(tmp_path: Path) -> None:
    class Other(Counting):
        async def embed(self, texts: list[str]) -> list[list[float]]:
            return [list(np.roll(v, 7)) for v in await super().embed(texts)]  # same name, other vectors

    assert await Precomputed.load(Other(LocalEmbedder()), SAMPLE_VECTORS) is None
    assert await Precomputed.load(Counting(MultilingualEmbedder()), SAMPLE_VECTORS) is None
    assert await Precomputed.load(Counting(LocalEmbedder()), SAMPLE_VECTORS) is not None
    damaged = tmp_path / "vectors.npz"
    damaged.write_text("version https://git-lfs.github.com/spec/v1\n")  # what a Git LFS checkout might leave
    assert await Precomputed.load(Counting(MultilingualEmbedder()), damaged) is None


# --- the history budget within the provider's context ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "ollama", "lmstudio", "budget"),
    [
        ({}, None, None, 12_000),  # says nothing: CONTEXT_TOKEN_BUDGET as configured
        ({"max_model_len": 4096}, None, None, 4096 - RESERVE),  # vLLM
        ({"context_length": 200_000}, None, None, 12_000),  # OpenRouter: larger than the budget
        ({}, {"num_ctx": 8192}, None, 8192 - RESERVE),  # Ollama, a Modelfile's num_ctx
        ({}, {"loaded_context": 4096}, None, 4096 - RESERVE),  # Ollama, loaded (as fake-model:latest)
        ({}, {"context_on_load": 6144}, None, 6144 - RESERVE),  # Ollama, loaded to find out
        ({}, {}, None, 12_000),  # Ollama that will not say: kept, with a warning
        ({}, None, {"loaded_context_length": 8192}, 8192 - RESERVE),  # LM Studio
        ({"max_model_len": 2048}, None, None, 512),  # too small for the reserve: a quarter for history
    ],
)
async def test_the_history_budget_fits_the_providers_context(
    fake_llm: FakeOpenAI,
    fields: dict[str, Any],
    ollama: dict[str, Any] | None,
    lmstudio: dict[str, Any] | None,
    budget: int,
) -> None:
    fake_llm.model_fields, fake_llm.ollama, fake_llm.lmstudio = fields, ollama, lmstudio
    assert await fitted_budget(provider(fake_llm)) == budget


async def test_the_engine_gets_the_fitted_budget(
    database_url: str, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.ollama = {"num_ctx": 4096}
    settings = provider(fake_llm, database_url=database_url, embeddings="openai", embeddings_model="fake-embed")
    with caplog.at_level(logging.WARNING, logger="bot.runtime.startup"):
        async with runtime.open_database(settings, run_migrations=False) as db:
            brain = await runtime.brain(settings, db)
            await brain.close()
    assert runtime.loop_config(settings, token_budget=brain.token_budget).token_budget == 4096 - RESERVE
    assert "OLLAMA_CONTEXT_LENGTH" in caplog.text


# --- the whole bot, over Slack, with a provider that has no embeddings -------------------------------------------


async def test_the_bot_starts_answers_and_says_why_search_is_full_text(
    database_url: str, fake_llm: FakeOpenAI, emulator: Any
) -> None:
    fake_llm.embeddings_status = 404
    emulator.add_user("U_ADMIN", "ada", "Ada Admin")
    settings = bot_settings(database_url, fake_llm, emulator, admin_user_ids="U_ADMIN")
    fake_llm.script(
        tools(tool_call("transfer_to_support", {"reason": "warranty"})),
        tools(tool_call("search_knowledge", {"query": QUESTION})),
        reply("Two years, see [1]."),
    )
    async with serving(settings, emulator) as bot:
        said = await emulator.user_says("C_SUPPORT", QUESTION)
        posts = await emulator.wait_for(lambda: len(p := emulator.posts("C_SUPPORT", said.ts)) >= 2 and p)
        assert [p.text for p in posts] == ["_Connecting you with Support…_", "Two years, see [1]."]
        # The passages found by full text reached the model.
        tool_result = fake_llm.requests[-1].messages[-1]
        assert tool_result["role"] == "tool" and "Warranty" in tool_result["content"]

        async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/healthz") as health:
            body = await health.json()
        assert health.status == 200 and body["ready"] is True
        assert body["knowledge"]["search"] == "full-text" and "EMBEDDINGS_MODEL" in body["knowledge"]["problems"][0]

        await emulator.slash_command("/support", "status", user="U_ADMIN", channel="C_STAFF")
        [answer] = await emulator.wait_for(lambda: emulator.response_log)
        shown = json.dumps(answer.body["blocks"], ensure_ascii=False)
        assert "*Knowledge*\\nfull-text search" in shown and "no embeddings endpoint" in shown


def test_the_local_model_keeps_its_token_table_int8_and_expands_the_rows_it_looks_up() -> None:
    from safetensors.numpy import load_file

    stored = load_file(str(MODEL_DIR / "model.safetensors"))
    weights = Weights(MODEL_DIR / "model.safetensors")
    assert weights.table.dtype == np.int8
    assert TABLE not in weights.w
    ids = np.array([0, 101, 102, 2023, 7592, 30521, 2023])
    expanded = stored[f"{TABLE}.int8"].astype(np.float32) * stored[f"{TABLE}.scale"][:, None]
    np.testing.assert_allclose(weights.tokens(ids), expanded[ids], rtol=1e-6)
    # The stacked query, key and value matrices are the stored ones, expanded.
    layer = "encoder.layer.3.attention.self"
    for n, part in enumerate(("query", "key", "value")):
        matrix = (
            stored[f"{layer}.{part}.weight.int8"].astype(np.float32) * stored[f"{layer}.{part}.weight.scale"][:, None]
        )
        np.testing.assert_allclose(weights.w[f"{layer}.qkv.weight"][n * 384 : (n + 1) * 384], matrix, rtol=1e-6)
        np.testing.assert_array_equal(
            weights.w[f"{layer}.qkv.bias"][n * 384 : (n + 1) * 384], stored[f"{layer}.{part}.bias"]
        )
