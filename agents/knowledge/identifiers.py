"""Identifiers: model numbers, part and error codes (`KM-2`, `LB-6800P`, `HXB-C`, `E-12`, `ERR_PAIR_CLAIMED`)
and version numbers (`4.6.1`).

Embeddings blur them and full text splits them into pieces, so they are matched on their own: each passage
keeps the identifiers it names (`kb_chunks.identifiers`, filled at ingestion), normalised to upper case
without hyphens or underscores, so that a customer's `km2` or `Km-2` finds `KM-2`, and `err_pair_claimed`
finds `ERR_PAIR_CLAIMED`; a version keeps its dots (`4.6.1` is not `46.1`), a leading `v` dropped.
"""

from __future__ import annotations

import re

_VERSION = r"\b[vV]?(\d{1,4}(?:\.\d{1,4}){2,3})\b"
"""Three or four numbers with dots (a leading `v` dropped): two (`2.99`) are prices and decimals more often."""
IN_DOCUMENT = re.compile(_VERSION + r"|\b([A-Z][A-Z0-9]{0,4}(?:-[A-Z0-9]{1,6})+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b")
"""As documents write them: a version, or capitals and digits around hyphens or underscores. Migrations 0020
and 0022 filled the column for passages stored before them with the same pattern in SQL."""
IN_QUESTION = re.compile(
    _VERSION + r"|\b([A-Za-z][A-Za-z0-9]{0,4}(?:-?[A-Za-z0-9]{1,6})(?:-[A-Za-z0-9]{1,6})*"
    r"|[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)\b"
)
"""As customers type them: a version, or any case, the hyphen optional; a candidate counts when it has a digit
or an underscore, or is written in capitals with its hyphen (`HXB-C`), so that words such as `wi-fi` are not
taken for codes."""


def normalise(code: str) -> str:
    return code.upper().replace("-", "").replace("_", "")


def in_document(text: str) -> set[str]:
    return {normalise(code or version) for version, code in IN_DOCUMENT.findall(text)}


def in_question(query: str) -> set[str]:
    return {
        normalise(token or version)
        for version, token in IN_QUESTION.findall(query)
        if version or any(ch.isdigit() or ch == "_" for ch in token) or ("-" in token and token.isupper())
    }
