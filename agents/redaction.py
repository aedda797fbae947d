"""Redaction before the model: card numbers, IBANs, emails and phone numbers a customer writes reach the provider as
placeholders (`[card-1]`, `[iban-1]`, `[email-1]`, `[phone-1]`), and the real values are put back in what comes out.

`Redactor` recognises the values: cards as 13-19 digits (spaces or dashes between groups) that pass Luhn's check,
IBANs by their checksum (python-stdnum), emails by their shape, phone numbers with Google's libphonenumber
(`phonenumbers`, valid numbers only, in the operator's region or written with a country code). An order number, a
date or a price is none of these and passes as written.

`RedactingModel` is the seam: a `Model` around the provider's that redacts every message of a request (the
customer's words, tool calls and results, the shared context, the summary, the prefetched passages) and restores
the response (the answer, each tool call's arguments, the streamed words) before anything else sees it. Everything
above the seam - the tools, the transcript, the reply, the llm_calls rows - only ever holds real text; only the
provider sees placeholders.

The mapping is recomputed for each request from that request's own text, numbering each kind's values in the order
they first appear, and nothing is stored: a second copy of the values would be one more thing to forget and
expire. A window keeps its beginning from call to call (instructions, shared context, summary, the oldest turns
kept), so a value is the same placeholder in every call of a conversation until the text before its first mention
changes - when the oldest turn leaves the window or the summary is rewritten, where a provider's prompt cache is cut
anyway. The model cannot be confused by a renumbering: its earlier answers are stored restored, and are sent again
with the numbers of the request they are in.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import phonenumbers
from stdnum import iban, luhn

from agents.model import Model, ModelResponse, TextSink

log = logging.getLogger(__name__)


class Kind(StrEnum):
    """What is recognised, in the order recognisers claim text: an IBAN's digits are not also a card's, nor a
    card's a phone number's."""

    IBAN = "iban"
    CARD = "card"
    EMAIL = "email"
    PHONE = "phone"


DEFAULT_KINDS = frozenset({Kind.CARD, Kind.IBAN})
"""On unless the operator says otherwise: numbers nobody needs a model to read."""


def parse_kinds(listed: str) -> frozenset[Kind]:
    """`card,iban` as the setting writes it; `none` alone turns redaction off."""
    words = {word.strip().lower() for word in listed.split(",") if word.strip()}
    if words == {"none"}:
        return frozenset()
    unknown = sorted(words - {kind.value for kind in Kind})
    if unknown or not words:
        named = ", ".join(unknown) or "(nothing)"
        known = ", ".join(kind.value for kind in Kind)
        raise ValueError(f"not something redaction recognises: {named}; name some of {known}, or `none`")
    return frozenset(Kind(word) for word in words)


@dataclass(frozen=True)
class Found:
    kind: Kind
    start: int
    end: int
    key: str
    """The value normalised (digits only, upper case, E.164): the same card however it is spaced is one value."""


# A run of digit groups, each separated by one space or dash; not the tail of a longer word or of "+49 ...".
_DIGIT_RUN = re.compile(r"(?<![\w+])\d+(?:[ -]\d+)*(?!\w)")
_DIGITS = re.compile(r"\d+")
_IBAN_START = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]){10,30}")
_IBAN_HEAD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2} ?$")
_EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
CARD_DIGITS = range(13, 20)


def _cards(text: str) -> Iterator[Found]:
    """Groups of a run joined into the longest stretch that is a card number, grouped as cards are printed (4-4-4-4,
    4-6-5) before any other way: "order 100234 4242 4242 4242 4242" holds one card and an order number, not an
    18-digit stretch that happens to pass Luhn's check (one in ten does)."""
    for run in _DIGIT_RUN.finditer(text):
        if len(run.group()) < CARD_DIGITS.start:
            continue
        if _IBAN_HEAD.search(text, max(0, run.start() - 6), run.start()):
            continue  # the rest of an IBAN that failed its checksum (a typo): not a card's digits either
        groups = [(run.start() + g.start(), run.start() + g.end(), g.group()) for g in _DIGITS.finditer(run.group())]
        claimed = [False] * len(groups)
        for printed in (True, False):
            i = 0
            while i < len(groups):
                for j in range(len(groups), i, -1):
                    digits = "".join(g[2] for g in groups[i:j])
                    if (
                        not any(claimed[i:j])
                        and len(digits) in CARD_DIGITS
                        and (not printed or _printed([len(g[2]) for g in groups[i:j]]))
                        and luhn.is_valid(digits)
                    ):
                        yield Found(Kind.CARD, groups[i][0], groups[j - 1][1], digits)
                        claimed[i:j] = [True] * (j - i)
                        i = j
                        break
                else:
                    i += 1


def _printed(sizes: list[int]) -> bool:
    """Grouped as a card prints its number: all in one, in fours, or 4-6-5 and 4-6-4 (American Express, Diners)."""
    fours = all(size == 4 for size in sizes[:-1]) and 1 <= sizes[-1] <= 4
    return len(sizes) == 1 or fours or sizes in ([4, 6, 5], [4, 6, 4])


def _ibans(text: str) -> Iterator[Found]:
    """The longest start of a candidate that is a valid IBAN, ending at a group's end: "DE89 3704 0044 0532 0130 00
    bitte" is an IBAN and a word."""
    for candidate in _IBAN_START.finditer(text):
        start, found = candidate.start(), candidate.group()
        for end in range(len(found), 0, -1):
            at_boundary = end == len(found) or found[end] == " "
            if at_boundary and found[end - 1] != " " and iban.is_valid(found[:end]):
                yield Found(Kind.IBAN, start, start + end, iban.compact(found[:end]))
                break


def _emails(text: str) -> Iterator[Found]:
    for match in _EMAIL.finditer(text):
        yield Found(Kind.EMAIL, match.start(), match.end(), match.group().lower())


def _phones(text: str, region: str | None) -> Iterator[Found]:
    # Without a region only numbers written with their country code (+49 ...) are read as numbers.
    for match in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
        key = phonenumbers.format_number(match.number, phonenumbers.PhoneNumberFormat.E164)
        yield Found(Kind.PHONE, match.start, match.end, key)


@dataclass(frozen=True)
class Redactor:
    kinds: frozenset[Kind] = DEFAULT_KINDS
    region: str | None = None
    """Where phone numbers written without a country code are read as local numbers ("DE": 030 1234567)."""

    def find(self, text: str) -> list[Found]:
        """The values in `text`, in order, never overlapping."""
        taken: list[Found] = []
        for kind in Kind:
            if kind not in self.kinds:
                continue
            for found in self._recognise(kind, text):
                if not any(found.start < t.end and t.start < found.end for t in taken):
                    taken.append(found)
        return sorted(taken, key=lambda f: f.start)

    def _recognise(self, kind: Kind, text: str) -> Iterator[Found]:
        match kind:
            case Kind.IBAN:
                return _ibans(text)
            case Kind.CARD:
                return _cards(text)
            case Kind.EMAIL:
                return _emails(text)
            case Kind.PHONE:
                return _phones(text, self.region)

    def redact(self, text: str) -> str:
        """`text` with its values replaced, numbered within it alone (an embeddings query, a one-off text)."""
        return Veil(self).text(text)


PLACEHOLDER = re.compile(r"\[(" + "|".join(kind.value for kind in Kind) + r")-(\d+)\]")
LONGEST_NUMBER = 6
"""Digits a placeholder's number may have: what the streamed preview holds back waiting for its `]`."""


class Veil:
    """One request's placeholders: each kind's values numbered in the order they first appear, each restored as it
    was first written."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.labels: dict[tuple[Kind, str], str] = {}
        self.values: dict[str, str] = {}
        """Placeholder -> the value as first written."""
        self._counts: Counter[Kind] = Counter()

    def text(self, text: str) -> str:
        out: list[str] = []
        at = 0
        for found in self.redactor.find(text):
            out += [text[at : found.start], self._label(found, text[found.start : found.end])]
            at = found.end
        return "".join(out) + text[at:] if out else text

    def _label(self, found: Found, written: str) -> str:
        label = self.labels.get((found.kind, found.key))
        if label is None:
            self._counts[found.kind] += 1
            label = f"[{found.kind.value}-{self._counts[found.kind]}]"
            self.labels[(found.kind, found.key)] = label
            self.values[label] = written
        return label

    def messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chat Completions messages with every text redacted: copies, the given ones untouched."""
        return [self._message(m) for m in messages]

    def _message(self, message: dict[str, Any]) -> dict[str, Any]:
        out = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            out["content"] = self.text(content)
        elif isinstance(content, list):
            out["content"] = [
                part | {"text": self.text(part["text"])} if isinstance(part.get("text"), str) else part
                for part in content
            ]
        if message.get("tool_calls"):
            out["tool_calls"] = [
                call | {"function": call["function"] | {"arguments": self.text(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
        return out

    def restore(self, text: str, *, in_json: bool = False) -> str:
        """`text` with the placeholders of this request replaced by their values (JSON-escaped `in_json`, for a
        tool call's arguments); a placeholder the request never had stays as written."""

        def value(match: re.Match[str]) -> str:
            found = self.values.get(match.group())
            if found is None:
                return match.group()
            return json.dumps(found, ensure_ascii=False)[1:-1] if in_json else found

        return PLACEHOLDER.sub(value, text)


def _could_open(tail: str) -> bool:
    """Whether `tail`, starting with "[", may yet become a placeholder as more words arrive."""
    body = tail[1:]
    for kind in Kind:
        head = f"{kind.value}-"
        if head.startswith(body):
            return True
        number = body[len(head) :]
        if body.startswith(head) and number.isdigit() and len(number) <= LONGEST_NUMBER:
            return True
    return False


class _Restoring:
    """The streamed words with the placeholders restored: what may be the start of one (`[car`, `[card-1`) waits for
    the next words, so the customer never watches a placeholder being typed."""

    def __init__(self, sink: TextSink, veil: Veil) -> None:
        self.sink: TextSink | None = sink
        self.veil = veil
        self.held = ""

    async def __call__(self, text: str) -> None:
        text = self.held + text
        opening = text.rfind("[")
        cut = opening if opening >= 0 and _could_open(text[opening:]) else len(text)
        self.held = text[cut:]
        if cut:
            await self._send(text[:cut])

    async def flush(self) -> None:
        held, self.held = self.held, ""
        if held:
            await self._send(held)

    async def _send(self, text: str) -> None:
        if self.sink is None:
            return
        try:
            await self.sink(self.veil.restore(text))
        except Exception:
            # The preview is the channel's; the answer still comes whole, so the call goes on.
            log.warning("the listener to a streamed answer failed; it hears no more of it", exc_info=True)
            self.sink = None


class RedactingModel:
    """`inner` (the provider's model) sent placeholders for the values `redactor` recognises; its answers, tool
    calls and streamed words come back with the values restored."""

    def __init__(self, inner: Model, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        veil = Veil(self.redactor)
        sent = veil.messages(messages)
        if not veil.values:
            return await self.inner.complete(model=model, messages=messages, tools=tools, on_text=on_text)
        preview = _Restoring(on_text, veil) if on_text is not None else None
        response = await self.inner.complete(model=model, messages=sent, tools=tools, on_text=preview)
        if preview is not None:
            await preview.flush()
        return replace(
            response,
            content=veil.restore(response.content) if response.content else response.content,
            tool_calls=tuple(
                replace(c, arguments=veil.restore(c.arguments, in_json=True)) for c in response.tool_calls
            ),
        )

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            await closer()
