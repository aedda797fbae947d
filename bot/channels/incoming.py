"""What arrives from either channel, as typed values: each edge (`bot.slack.events`, `bot.teams.events`) makes
these, and intake and the case desk take them without knowing the platform."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.address import DM, Address, Platform
from agents.attachments import FileRef
from agents.identity import Author
from escalation.desk import Action
from escalation.views import ACTION_CLAIM, ACTION_HAND_BACK, ACTION_RESOLVE

ACK_WITHIN_S = 2.0
"""How long a case button's change may run before the platform gets its answer (Slack wants one within 3 s); a
change held longer by a running turn finishes afterwards."""
CASE_ACTIONS: dict[str, Action] = {ACTION_CLAIM: "claim", ACTION_RESOLVE: "resolve", ACTION_HAND_BACK: "hand_back"}
"""The desk's action behind each case button."""


@dataclass(frozen=True)
class CustomerMessage:
    team: str
    channel: str
    thread_ts: str
    """The thread's root: the conversation is (team, channel, thread_ts), since a ts is unique per channel.
    `DM` for a chat without threads (Teams' personal and group chats), one conversation per chat."""
    ts: str
    user: str
    text: str
    is_dm: bool
    user_team: str
    """The writer's own workspace: another company's in a Slack Connect channel."""
    platform: Platform
    name: str | None = None
    """The writer's name where the delivery carries it (Teams does; Slack's edge asks `users.info`)."""
    files: tuple[FileRef, ...] = ()
    """What it carried; read before its turn (bot.slack.files), so a message of files alone is answered too."""
    shared: bool = False
    """The channel is shared with another organisation (Slack Connect: the envelope's is_ext_shared_channel), where
    our own colleagues write beside the customers."""
    locale: str | None = None
    """The writer's locale where the delivery carries it (a Teams activity's `locale`; Slack's edge asks
    `users.info`)."""

    @property
    def author(self) -> Author:
        """Who wrote it, as far as the signed delivery says (the edge may add name, email and locale)."""
        return Author(self.platform, self.user_team, self.user, self.name, locale=self.locale)

    @property
    def address(self) -> Address:
        return Address(self.platform, self.team, self.channel, None if self.thread_ts == DM else self.thread_ts)

    @property
    def conversation_key(self) -> str:
        return self.address.key


@dataclass(frozen=True)
class StaffReply:
    """A colleague writing in a case thread of the staff channel."""

    channel: str
    case_ts: str
    ts: str
    user: str
    text: str
    team: str
    platform: Platform
    user_team: str | None = None
    """The author's organisation where the message says (Slack Connect), to compare with ours."""
    name: str | None = None
    files: tuple[FileRef, ...] = ()
    """Relayed to the customer with the words; a message of files alone is relayed too."""

    @property
    def author(self) -> Author:
        return Author(self.platform, self.user_team or self.team, self.user, self.name)


@dataclass(frozen=True)
class StaffEdit:
    channel: str
    case_ts: str
    ts: str
    text: str


@dataclass(frozen=True)
class StaffDelete:
    channel: str
    case_ts: str
    ts: str


@dataclass(frozen=True)
class Ignored:
    reason: str


Incoming = CustomerMessage | StaffReply | StaffEdit | StaffDelete | Ignored


@dataclass(frozen=True)
class CaseAction:
    """A button pressed on a case message."""

    action_id: str
    escalation_id: int
    user: str
    channel: str | None
    team: str | None = None
    """Our workspace, where the button was pressed."""
    user_team: str | None = None
    """The presser's own workspace."""


@dataclass(frozen=True)
class Delivery:
    """What identifies one delivery (a Slack event, a Teams activity), whatever it carries."""

    event_id: str
    event_type: str
    team_id: str | None


def sanitised(value: Any) -> Any:
    """The payload with every string made storable: Postgres text holds no NUL, and UTF-8 no lone surrogate (JSON
    can spell both, and Slack passes through what clients send); each becomes U+FFFD, so the message is still
    stored and answered."""
    if isinstance(value, str):
        if value.isascii() and "\x00" not in value:
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace").replace("\x00", "\ufffd")
    if isinstance(value, Mapping):
        return {sanitised(k): sanitised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitised(v) for v in value]
    return value
