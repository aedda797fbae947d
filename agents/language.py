"""The languages the bot speaks in its own words and searches in: one closed set, and how a text's is told.

Detection is py3langid (a naive Bayes model over byte n-grams, shipped inside its package: nothing is
downloaded) restricted to `Language`, so a word of another language cannot pull a text outside the set. A short
or ambiguous text ("ok", "hi", an order number) has no language: `detect` returns None and the caller keeps what it
knew (the conversation's language, the platform's locale, the operator's default).
"""

from __future__ import annotations

import enum
import functools
import re
import unicodedata
from typing import Any


class Language(enum.StrEnum):
    """ISO 639-1 codes; the bot's own texts exist in each (bot.texts), and each has a Postgres text-search
    configuration (`pg_config`)."""

    EN = "en"
    ES = "es"
    DE = "de"
    FR = "fr"
    PT = "pt"

    @property
    def pg_config(self) -> str:
        """Postgres's built-in text-search configuration (a Snowball stemmer and stop words) for the language."""
        return _PG_CONFIG[self]

    @property
    def english_name(self) -> str:
        return _NAMES[self]

    @classmethod
    def parse(cls, value: str | None) -> Language | None:
        """A code or a locale ("es", "es-MX", "pt_BR", "de-DE") as one of ours; None for any other."""
        if not value:
            return None
        code = re.split(r"[-_]", value.strip().lower(), maxsplit=1)[0]
        try:
            return cls(code)
        except ValueError:
            return None


_PG_CONFIG = {
    Language.EN: "english",
    Language.ES: "spanish",
    Language.DE: "german",
    Language.FR: "french",
    Language.PT: "portuguese",
}
_NAMES = {
    Language.EN: "English",
    Language.ES: "Spanish",
    Language.DE: "German",
    Language.FR: "French",
    Language.PT: "Portuguese",
}

CONFIDENCE = 0.8
"""py3langid's normalised probability below which a text counts as undecided: at 0.8, "como cambio la bateria"
(0.87) and "Akku lädt nicht mehr" (1.0) are told, "hi" (0.2), "ok" (0.2) and "thanks!" (0.65) are not."""
MIN_LETTERS = 4


@functools.cache
def _identifier() -> Any:
    import numpy as np
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier  # type: ignore[import-untyped]
    from py3langid.modelio import load_model  # type: ignore[import-untyped]

    # Built on our languages' columns alone: `set_languages` keeps the whole model beside them (27 MB for 97
    # languages of which we tell five).
    ptc, pc, classes, nextmove, row, output = load_model(MODEL_DIR / MODEL_FILE)
    ours = {language.value for language in Language}
    kept = [i for i, code in enumerate(classes) if code in ours]
    return LanguageIdentifier(
        np.ascontiguousarray(np.asarray(ptc)[:, kept]),
        np.asarray(pc)[kept],
        [classes[i] for i in kept],
        nextmove,
        output,
        norm_probs=True,
        tk_row=row,
    )


def warm() -> None:
    """Load the model (about half a second) at start-up rather than in the first customer's turn."""
    _identifier()


def detect(text: str, *, confidence: float = CONFIDENCE) -> Language | None:
    """The language of `text` among ours, or None when the text is too short or the model unsure."""
    if sum(ch.isalpha() for ch in text) < MIN_LETTERS:
        return None
    code, probability = _identifier().classify(text)
    if probability < confidence:
        return None
    return Language(code)


FIRST_CONFIDENCE = 0.5
"""The confidence enough for a conversation's first language, told from a message of `SWITCH_LETTERS` or more."""
SWITCH_LETTERS = 15
"""Letters a customer's message needs to change a language already known: "please", "thank you" or "firmware 2.1
update" (told as English, and sure of it) do not turn a German conversation English; "como cambio la bateria" turns
an English one (perhaps only the platform's locale) Spanish."""

_NOT_PROSE = re.compile(
    r"```.*?(?:```|\Z)"  # a code block
    r"|`[^`\n]*`"  # inline code
    r"|^[ \t]*(?:>|&gt;)[^\n]*"  # a quoted line (Slack escapes its `>`)
    r"|<[^<>\n]+>"  # a Slack mention, channel or link (its label too)
    r"|\b(?:https?://|www\.)\S+"  # a bare address
    r"|[\w.%+-]+@[\w-]+(?:\.[\w-]+)+"  # an email address
    r"|:[a-z0-9_+-]+:",  # an emoji's short name
    re.DOTALL | re.MULTILINE,
)


def prose(text: str) -> str:
    """`text` without what its writer did not write in their own words: code, quotes, links, addresses, emoji."""
    return _NOT_PROSE.sub(" ", text)


def heard(text: str, known: Language | None) -> Language | None:
    """The language of a customer's message as the conversation's: told from its prose (a pasted error or a quoted
    answer is not how the customer speaks), and changing a `known` one only when the message is long enough
    (`SWITCH_LETTERS`); else `known`."""
    words = prose(text)
    letters = sum(ch.isalpha() for ch in words)
    if known is not None and letters < SWITCH_LETTERS:
        return known
    # A first sentence of some length is told at a lower confidence: informal Spanish without accents sits between
    # Spanish and Portuguese ("hola, como cambio la bateria de mi dron? no carga": 0.60), and either is nearer the
    # customer than the operator's default; a short one ("refund pls": German at 0.54) still needs CONFIDENCE.
    loose = known is None and letters >= SWITCH_LETTERS
    return detect(words, confidence=FIRST_CONFIDENCE if loose else CONFIDENCE) or known


def fold(text: str) -> str:
    """Accents dropped ("bateria" for "batería", "laedt" is not made of "lädt": only the marks go), as Postgres's
    `unaccent` does for the letters of these five languages; used where the database is not."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))
