"""How human takeover behaves: texts, business hours, internal notes, reminders. Read from settings once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, time
from zoneinfo import ZoneInfo

from agents.texts import Texts

_DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


@dataclass(frozen=True)
class BusinessHours:
    """Working days and hours in a time zone, e.g. `Mon-Fri 09:00-17:00` in Europe/Berlin."""

    days: frozenset[int]
    start: time
    end: time
    zone: ZoneInfo
    label: str

    @classmethod
    def parse(cls, spec: str, zone: str = "UTC") -> BusinessHours | None:
        """None (always open) for an empty spec; ValueError for one that cannot be read."""
        if not spec.strip():
            return None
        match = re.fullmatch(r"\s*(\w{3})(?:-(\w{3}))?\s+(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})\s*", spec)
        if match is None or match[1].lower() not in _DAYS or (match[2] and match[2].lower() not in _DAYS):
            raise ValueError(f"BUSINESS_HOURS must look like 'Mon-Fri 09:00-17:00', got {spec!r}")
        first = _DAYS.index(match[1].lower())
        last = _DAYS.index((match[2] or match[1]).lower())
        days = frozenset(range(first, last + 1)) if first <= last else frozenset([*range(first, 7), *range(last + 1)])
        start, end = time(int(match[3]), int(match[4])), time(int(match[5]), int(match[6]))
        return cls(days, start, end, ZoneInfo(zone), f"{spec.strip()} ({zone})")

    def is_open(self, at: datetime) -> bool:
        local = at.astimezone(self.zone)
        return local.weekday() in self.days and self.start <= local.time() < self.end


@dataclass(frozen=True)
class EscalationPolicy:
    staff_channel: str | None
    note_marker: str = "note:"
    """A staff message starting with this (case-insensitive) stays internal: not relayed."""
    hours: BusinessHours | None = None
    texts: Texts = field(default_factory=Texts)
    """What the customer is told (off hours, resolved, handed back), in the conversation's language."""
    reminder_after_s: float = 15 * 60
    max_reminders: int = 2
    llm_summary: bool = True
    """Summarise the conversation with the LLM for the case message (else: its last messages)."""

    def is_note(self, text: str) -> bool:
        return bool(self.note_marker) and text.strip().lower().startswith(self.note_marker.lower())
