"""Write the sample's `knowledge/vectors.npz`: its passages embedded by the local model the default (EMBEDDINGS=local)
chooses for them, the English one (the sample is in English), which a first start uses instead of embedding them
(after checking a few against the model).

Run after changing the sample or the local model (tests/test_first_start.py fails until you do):

    python scripts/sample_vectors.py
"""

from __future__ import annotations

import asyncio

from agents.knowledge.chunking import chunk_document
from agents.knowledge.documents import find_documents, read_document
from agents.knowledge.embedders import save_precomputed
from agents.knowledge.local import LocalEmbedder
from harness.sample import SAMPLE_COLLECTIONS, SAMPLE_KNOWLEDGE, SAMPLE_VECTORS


def sample_texts() -> list[str]:
    return [
        chunk.embedding_text
        for collection in SAMPLE_COLLECTIONS
        for path in find_documents([SAMPLE_KNOWLEDGE / collection])
        for chunk in chunk_document(read_document(path, source=str(path.relative_to(SAMPLE_KNOWLEDGE))))
    ]


async def main() -> None:
    embedder = LocalEmbedder()
    texts = sample_texts()
    save_precomputed(SAMPLE_VECTORS, embedder.name, texts, await embedder.embed(texts))
    print(f"wrote {SAMPLE_VECTORS}: {len(texts)} passages, {SAMPLE_VECTORS.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    asyncio.run(main())
