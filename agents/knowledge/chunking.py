"""Chunks: paragraphs packed within a token budget inside each section, with overlap between neighbours,
each carrying its document's title and its section heading."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.knowledge.documents import Document
from agents.messages import estimate_tokens


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    title: str
    heading: str | None
    text: str

    @property
    def embedding_text(self) -> str:
        """What is embedded: title and heading give a short passage the context a reader would have."""
        return " — ".join(part for part in (self.title, self.heading) if part) + "\n" + self.text


def _pieces(text: str, budget: int) -> list[str]:
    """Paragraphs; a paragraph over budget is cut at sentence ends."""
    out: list[str] = []
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()):
        if estimate_tokens(paragraph) <= budget:
            out.append(paragraph)
            continue
        sentence_run: list[str] = []
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
            if sentence_run and estimate_tokens(" ".join([*sentence_run, sentence])) > budget:
                out.append(" ".join(sentence_run))
                sentence_run = []
            sentence_run.append(sentence)
        if sentence_run:
            out.append(" ".join(sentence_run))
    return out


def chunk_document(document: Document, *, max_tokens: int = 300, overlap_tokens: int = 40) -> list[Chunk]:
    chunks: list[Chunk] = []
    for section in document.sections:
        current: list[str] = []
        for piece in _pieces(section.text, max_tokens):
            if current and estimate_tokens("\n\n".join([*current, piece])) > max_tokens:
                chunks.append(Chunk(len(chunks), document.title, section.heading, "\n\n".join(current)))
                tail = current[-1]
                # Overlap: the end of the previous chunk opens the next, so an answer cut in two is whole once.
                current = [tail[-overlap_tokens * 4 :]] if overlap_tokens and estimate_tokens(tail) > 0 else []
            current.append(piece)
        if current:
            chunks.append(Chunk(len(chunks), document.title, section.heading, "\n\n".join(current)))
    return chunks
