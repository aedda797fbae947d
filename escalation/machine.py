"""Human takeover as one state machine: the conversation's mode and its case's status, and every move between
them. Nothing else decides a mode or a case status: the engine asks through its `Takeover` hooks (and writes
the answer with the turn), the case desk asks for staff actions (and writes the answer under the lease).

    mode    bot ──escalate──▶ awaiting_human ──claim / first staff reply──▶ human
             ▲                      │                                         │
             └──── hand back ◀──────┴─────────────────────────────────────────┘
                                    └──── resolve / close ──▶ closed ──customer writes──▶ bot (entry agent)
            any ──a colleague writes in the customer's own thread (Slack Connect)──▶ human

    case    open ──claim / first staff reply / colleague in the thread──▶ claimed ──▶ resolved | handed_back
            open ──────────────────────────────────────────────────────────────────▶ resolved | handed_back
            (none) ──colleague in the customer's thread──▶ claimed (opened for them)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from agents.conversations import CaseChange, ColleagueStep, OpenCase, Route


class Mode(StrEnum):
    BOT = "bot"
    AWAITING_HUMAN = "awaiting_human"
    HUMAN = "human"
    CLOSED = "closed"


WITH_HUMANS = (Mode.AWAITING_HUMAN, Mode.HUMAN)


class CaseStatus(StrEnum):
    OPEN = "open"
    CLAIMED = "claimed"
    RESOLVED = "resolved"
    HANDED_BACK = "handed_back"


OPEN_CASE = (CaseStatus.OPEN, CaseStatus.CLAIMED)

StaffAction = Literal["claim", "resolve", "hand_back"]


@dataclass(frozen=True)
class Refused:
    message: str


@dataclass(frozen=True)
class Moved:
    """A staff action's effect: the conversation's new mode, the case's new status and who took it."""

    mode: Mode
    status: CaseStatus
    claimed_by: str | None
    closed: bool
    """The case ends here (closed_by and closed_at are written)."""
    tell_customer: Literal["resolved", "handed_back"] | None
    message: str
    """What the colleague is told."""


class Takeover:
    """The engine's hooks (agents.conversations.Takeover) and the desk's transitions, in one place."""

    # ---- the engine's side: a customer message, a turn's end, a colleague's reply in the case thread

    def route(self, mode: str) -> Route:
        match Mode(mode):
            case Mode.BOT:
                return "bot"
            case Mode.CLOSED:
                return "reopen"  # a new question after a resolved case: the entry agent, from scratch
            case Mode.AWAITING_HUMAN | Mode.HUMAN:
                return "human"

    def after_turn(self, *, escalated: bool) -> str:
        return Mode.AWAITING_HUMAN if escalated else Mode.BOT

    def staff_reply(self, mode: str, case: OpenCase | None, author: str | None) -> tuple[str, CaseChange] | None:
        """A colleague wrote in the case thread: relayed while humans have the conversation, and the first reply
        claims an unclaimed case for its author. None: the case was handed back or closed meanwhile."""
        if case is None or Mode(mode) not in WITH_HUMANS:
            return None
        claimed_by = case.claimed_by or author
        return Mode.HUMAN, CaseChange(CaseStatus.CLAIMED, claimed_by, answered=True)

    def colleague_wrote(self, mode: str, case: OpenCase | None, author: str | None) -> ColleagueStep:
        """A colleague wrote in the customer's own thread: humans have the conversation from now on, whatever its
        mode. The open case is claimed for them (unless someone has it already); with none, one is opened for them,
        claimed. They answered the customer themselves, in the thread."""
        claimed_by = (case.claimed_by if case else None) or author
        return ColleagueStep(Mode.HUMAN, CaseChange(CaseStatus.CLAIMED, claimed_by, answered=True), opens=case is None)

    # ---- the desk's side: buttons and admin commands

    def act(
        self, action: StaffAction, *, status: str, claimed_by: str | None, user: str, case_id: int
    ) -> Moved | Refused:
        current = CaseStatus(status)
        if current not in OPEN_CASE:
            return Refused(f"Case #{case_id} is already {current.replace('_', ' ')}.")
        match action:
            case "claim":
                if claimed_by is not None:
                    return Refused(f"Case #{case_id} is already claimed by <@{claimed_by}>.")
                return Moved(Mode.HUMAN, CaseStatus.CLAIMED, user, False, None, f"You have claimed case #{case_id}.")
            case "resolve":
                return Moved(
                    Mode.CLOSED, CaseStatus.RESOLVED, claimed_by, True, "resolved", f"Case #{case_id} resolved."
                )  # fmt: skip
            case "hand_back":
                # The last AI agent picks up again, with the human exchange in its transcript.
                return Moved(
                    Mode.BOT, CaseStatus.HANDED_BACK, claimed_by, True, "handed_back",
                    f"Case #{case_id} handed back to the bot.",
                )  # fmt: skip

    def close(self, mode: str) -> Mode | Refused:
        """An admin closes a conversation that has no open case."""
        return Refused("That conversation is already closed.") if Mode(mode) == Mode.CLOSED else Mode.CLOSED

    def reset(self, mode: str) -> tuple[Mode, bool]:
        """An admin resets a conversation: back to the bot; True when a customer who was with a person must be
        told."""
        return Mode.BOT, Mode(mode) in WITH_HUMANS


TAKEOVER = Takeover()
