"""Knowledge in each document's language, on real Postgres: full text stemmed in the document's language from
accent-folded text (found by a question written without accents, or with another inflection), the language
declared for a collection winning over detection, and the multilingual embedder matching across languages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import knowledge_search, relevant
from agents.language import Language
from bot.declaration.build import build
from bot.declaration.parse import DeclarationError, load

Sessions = async_sessionmaker[AsyncSession]

SPANISH = """# Batería del móvil

## Si la batería no se carga

Si la batería del móvil no se carga, cambie el cargador y revise el cable antes de pedir una reparación.

## Horario de atención

Atendemos de lunes a viernes, de nueve a seis, en todas las tiendas de la cadena.
"""

GERMAN = """# Rücksendungen

## Fristen

Rücksendungen sind innerhalb von 30 Tagen kostenlos, wenn die Ware unbenutzt und vollständig ist.
"""


@pytest.fixture(scope="session")
async def multilingual() -> MultilingualEmbedder:
    """Loaded once for the session."""
    embedder = MultilingualEmbedder()
    assert await embedder.load() is None
    return embedder


async def _languages(sessions: Sessions) -> dict[str, str | None]:
    async with sessions() as s:
        rows = await s.execute(select(m.KnowledgeDocument.source, m.KnowledgeDocument.language))
        return {source: language for source, language in rows}


@pytest.fixture
def help_centre(tmp_path: Path) -> Path:
    """One collection in two languages, as a help centre for Spain and Germany would have it."""
    docs = tmp_path / "help"
    docs.mkdir()
    (docs / "bateria.md").write_text(SPANISH, encoding="utf-8")
    (docs / "ruecksendung.md").write_text(GERMAN, encoding="utf-8")
    return docs


async def test_each_document_is_stemmed_in_its_detected_language_and_found_without_accents(
    kb: KnowledgeBase, sessions: Sessions, help_centre: Path
) -> None:
    await kb.ingest([help_centre], collection="help", root=help_centre)
    assert await _languages(sessions) == {"bateria.md": "es", "ruecksendung.md": "de"}
    # "bateria" is not "batería" to an English stemmer (nor to a Spanish one, without folding: "bat").
    hits = await kb.search("la bateria no carga", collections=["help"], k=3, mode="text")
    assert hits and hits[0].heading == "Si la batería no se carga"
    assert hits[0].text_match == 1.0


async def test_a_german_document_is_found_by_another_inflection_of_its_words(
    kb: KnowledgeBase, help_centre: Path
) -> None:
    await kb.ingest([help_centre], collection="help", root=help_centre)
    # Rücksendungen / rucksendung, Tagen / tage: one German stem each.
    hits = await kb.search("rucksendung innerhalb tage", collections=["help"], k=3, mode="text")
    assert hits and hits[0].source == "ruecksendung.md"
    assert hits[0].text_match == 1.0


async def test_the_declared_language_wins_over_detection_and_is_kept(
    kb: KnowledgeBase, sessions: Sessions, help_centre: Path, tmp_path: Path
) -> None:
    (tmp_path / "helpdesk.yaml").write_text(
        "version: 1\nbrand: {name: Acme}\nentry: desk\nknowledge:\n  help: {path: help, language: es_ES}\n"
        "agents:\n  desk: {title: the desk, description: Answers., instructions: Help.}\n",
        encoding="utf-8",
    )
    [collection] = build(load(tmp_path / "helpdesk.yaml")).collections
    assert collection.language == Language.ES
    await kb.ingest([help_centre], collection="help", root=help_centre, language=collection.language)
    assert await _languages(sessions) == {"bateria.md": "es", "ruecksendung.md": "es"}
    # Declared once, kept for later ingestions that declare nothing (`kb ingest` without --language).
    (help_centre / "more.md").write_text("# Devoluciones\n\nTiene treinta días para devolver un pedido.\n")
    await kb.ingest([help_centre], collection="help", root=help_centre)
    assert (await _languages(sessions))["more.md"] == "es"


def test_an_unknown_collection_language_is_refused(tmp_path: Path) -> None:
    (tmp_path / "help").mkdir()
    (tmp_path / "helpdesk.yaml").write_text(
        "version: 1\nbrand: {name: Acme}\nentry: desk\nknowledge:\n  help: {path: help, language: klingon}\n"
        "agents:\n  desk: {title: the desk, description: Answers., instructions: Help.}\n",
        encoding="utf-8",
    )
    with pytest.raises(DeclarationError) as raised:
        build(load(tmp_path / "helpdesk.yaml"))
    assert any("language" in problem for problem in raised.value.problems)


async def test_the_multilingual_embedder_matches_a_german_question_to_a_spanish_passage(
    multilingual: MultilingualEmbedder,
) -> None:
    [question] = await multilingual.embed_query(["Der Akku lädt nicht mehr"])
    passages = await multilingual.embed(
        ["La batería no se carga: revise el cargador y el cable.", "Nuestras oficinas abren de lunes a viernes."]
    )
    battery, hours = (float(np.dot(question, p)) for p in passages)
    assert battery > hours


# --- the local models chosen per collection (EMBEDDINGS=local) ------------------------------------------------------

ENGLISH = """# Phone battery

## If the battery does not charge

If the phone's battery does not charge, change the charger and check the cable before asking for a repair.
"""


@pytest.fixture(scope="session")
async def minilm() -> LocalEmbedder:
    embedder = LocalEmbedder()
    assert await embedder.load() is None
    return embedder


async def test_english_collections_go_to_minilm_the_others_to_e5_and_a_search_reads_both(
    sessions: Sessions, multilingual: MultilingualEmbedder, minilm: LocalEmbedder, tmp_path: Path
) -> None:
    kb = KnowledgeBase(sessions=sessions, embedder=multilingual, english=minilm)
    english, spanish = tmp_path / "en", tmp_path / "es"
    english.mkdir()
    spanish.mkdir()
    (english / "battery.md").write_text(ENGLISH, encoding="utf-8")
    (spanish / "bateria.md").write_text(SPANISH, encoding="utf-8")
    await kb.ingest([english], collection="english", root=english)
    await kb.ingest([spanish], collection="spanish", root=spanish)
    assert {row["collection"]: row["embedder"] for row in await kb.stats()} == {
        "english": LocalEmbedder.name,
        "spanish": MultilingualEmbedder.name,
    }
    # One question, embedded by each model, each collection searched by its own; in vector mode too.
    for mode in ("hybrid", "vector"):
        hits = await kb.search("battery does not charge", collections=["english", "spanish"], k=4, mode=mode)
        assert {h.collection for h in hits} == {"english", "spanish"}
        assert {(h.collection, h.min_similarity) for h in hits if h.heading and "charge" in h.heading} == {
            ("english", LocalEmbedder.min_similarity)
        }
        assert all(h.min_similarity == MultilingualEmbedder.min_similarity for h in hits if h.collection == "spanish")
    # The tool judges each passage by its own model's cut-off (e5's cosines run far higher than MiniLM's).
    found = relevant(await kb.search("battery does not charge", collections=["english", "spanish"]), "battery")
    assert [h.heading for h in found if h.collection == "english"] == ["If the battery does not charge"]


async def test_a_collection_turning_multilingual_is_embedded_again_by_e5(
    sessions: Sessions, multilingual: MultilingualEmbedder, minilm: LocalEmbedder, tmp_path: Path
) -> None:
    kb = KnowledgeBase(sessions=sessions, embedder=multilingual, english=minilm)
    docs = tmp_path / "help"
    docs.mkdir()
    (docs / "battery.md").write_text(ENGLISH, encoding="utf-8")
    await kb.ingest([docs], collection="help", root=docs)
    assert [row["embedder"] for row in await kb.stats()] == [LocalEmbedder.name]
    (docs / "bateria.md").write_text(SPANISH, encoding="utf-8")
    await kb.ingest([docs], collection="help", root=docs)
    assert [row["embedder"] for row in await kb.stats()] == [MultilingualEmbedder.name]
    assert (await kb.status()).unembedded == 0  # the English page kept, with a vector of the new model
    hits = await kb.search("la batería no se carga", collections=["help"], k=2, mode="vector")
    assert hits[0].source == "bateria.md" and hits[0].min_similarity == MultilingualEmbedder.min_similarity


async def test_the_tool_names_the_articles_language(
    sessions: Sessions, multilingual: MultilingualEmbedder, minilm: LocalEmbedder, help_centre: Path, tmp_path: Path
) -> None:
    kb = KnowledgeBase(sessions=sessions, embedder=multilingual, english=minilm)
    english = tmp_path / "en"
    english.mkdir()
    (english / "battery.md").write_text(ENGLISH, encoding="utf-8")
    await kb.ingest([english], collection="english", root=english)
    await kb.ingest([help_centre], collection="help", root=help_centre)
    [only_english] = knowledge_search(kb, collections=["english"])[:1]
    [mixed] = knowledge_search(kb, collections=["help"])[:1]
    assert "The articles are in English: write the query in English." in only_english.description
    assert "The articles are in German and Spanish" in mixed.description
