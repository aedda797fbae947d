"""Identifiers: model numbers, part and error codes (`KM-2`, `LB-6800P`, `HXB-C`, `E-12`).

Embeddings blur them and full text splits them into pieces, so they are matched on their own: each passage
keeps the identifiers it names (`kb_chunks.identifiers`, filled at ingestion), normalised to upper case
without the hyphen, so that a customer's `km2` or `Km-2` finds `KM-2`.
"""

from __future__ import annotations

import re

IN_DOCUMENT = re.compile(r"\b[A-Z][A-Z0-9]{0,4}(?:-[A-Z0-9]{1,6})+\b")
"""As documents write them: capitals and digits around a hyphen. The migration (0020) that filled the column
for passages stored before it used the same pattern in SQL."""
IN_QUESTION = re.compile(r"\b[A-Za-z][A-Za-z0-9]{0,4}(?:-?[A-Za-z0-9]{1,6})(?:-[A-Za-z0-9]{1,6})*\b")
"""As customers type them: any case, the hyphen optional; a candidate counts when it has a digit, or is
written in capitals with its hyphen (`HXB-C`), so that words such as `wi-fi` are not taken for codes."""


def normalise(code: str) -> str:
    return code.upper().replace("-", "")


def in_document(text: str) -> set[str]:
    return {normalise(code) for code in IN_DOCUMENT.findall(text)}


def in_question(query: str) -> set[str]:
    return {
        normalise(token)
        for token in IN_QUESTION.findall(query)
        if any(ch.isdigit() for ch in token) or ("-" in token and token.isupper())
    }
