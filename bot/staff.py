"""Who speaks for the company in a case: whose replies in a case thread reach the customer, and whose Claim,
Resolve and Hand back clicks count.

Being in the staff channel is not enough: a public staff channel lets any customer who joins it in, and guests
and people of other organisations (Slack Connect) can be invited to any channel. So guests and external members
never count, and with an allow-list (STAFF_USER_IDS, STAFF_USERGROUP_ID) only the people on it do.

In a customer's own thread the question is the other way round (`Colleagues`): who is not a customer, so that
their message takes the conversation over instead of getting an answer from the bot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from agents.identity import Author


class Standing(StrEnum):
    STAFF = "staff"
    GUEST = "guest"
    EXTERNAL = "external"
    """A member of another organisation (Slack Connect) or another workspace."""
    UNLISTED = "unlisted"
    """Not on the staff allow-list."""
    UNKNOWN = "unknown"
    """Slack does not know the user."""


_WHY = {
    Standing.GUEST: "guest accounts cannot",
    Standing.EXTERNAL: "people from outside this workspace cannot",
    Standing.UNLISTED: "you are not on the support team's list",
    Standing.UNKNOWN: "Slack could not tell who you are",
}


def refusal(standing: Standing, *, doing: str) -> str:
    """What a person who is not staff is told, ephemerally."""
    return f"Only the support team can {doing} ({_WHY[standing]})."


REPLY_REFUSED = "reply to customers in case threads; your message was not passed on"
ACTION_REFUSED = "claim, resolve or hand back cases"


@dataclass(frozen=True)
class Member:
    """A Slack user as far as standing goes (users.info)."""

    id: str
    team: str | None
    guest: bool
    """is_restricted (multi-channel guest) or is_ultra_restricted (single-channel guest)."""
    stranger: bool
    """is_stranger: shown to us through a shared channel, of another organisation."""
    admin: bool
    """A workspace admin or owner."""

    def outsider(self, team: str | None) -> Standing | None:
        """Why this person cannot act for workspace `team` (ours), or None."""
        if self.stranger or (team is not None and self.team is not None and self.team != team):
            return Standing.EXTERNAL
        return Standing.GUEST if self.guest else None


class Members(Protocol):
    """Slack's directory (`bot.slack.app.SlackDirectory`), briefly cached."""

    async def member(self, user: str) -> Member | None: ...

    async def usergroup(self, group: str) -> frozenset[str]: ...


@dataclass(frozen=True)
class StaffList:
    """The allow-list; empty: everyone in the staff channel who is neither a guest nor external."""

    users: frozenset[str] = frozenset()
    usergroup: str | None = None

    @property
    def restricts(self) -> bool:
        return bool(self.users) or self.usergroup is not None


class StaffGate:
    def __init__(self, *, members: Members, listed: StaffList) -> None:
        self.members = members
        self.listed = listed

    async def standing(self, user: str, *, team: str | None, user_team: str | None = None) -> Standing:
        """`team`: our workspace (the request's); `user_team`: the author's, when the payload says (Slack Connect
        messages carry it). Raises when Slack cannot be asked (the caller refuses, or has Slack retry)."""
        if team is not None and user_team is not None and user_team != team:
            return Standing.EXTERNAL
        if self.listed.restricts and not await self._listed(user):
            return Standing.UNLISTED
        member = await self.members.member(user)
        if member is None:
            return Standing.UNKNOWN
        return member.outsider(team) or Standing.STAFF

    async def _listed(self, user: str) -> bool:
        if user in self.listed.users:
            return True
        return self.listed.usergroup is not None and user in await self.members.usergroup(self.listed.usergroup)


@dataclass(frozen=True)
class Colleagues:
    """Who, writing in a customer's thread, speaks for the company rather than asking it (Slack Connect): in a
    channel shared with another organisation, members of our own workspace; in any channel, members of a
    workspace in STAFF_TEAM_IDS and people whose verified email is at a domain in STAFF_EMAIL_DOMAINS. Guests
    never are, whatever their workspace or email; nor anyone Slack does not describe. Our own workspace counts
    only in shared channels: in a community workspace, the customers are its members too."""

    teams: frozenset[str] = frozenset()
    email_domains: frozenset[str] = frozenset()
    """Lower case, without the `@`."""

    def worth_asking(self, *, shared: bool) -> bool:
        """Whether a message in this channel can come from a colleague at all (so the ack looks at its writer)."""
        return shared or bool(self.teams or self.email_domains)

    def includes(self, author: Author, member: Member | None, *, team: str, shared: bool) -> bool:
        """`author` as identified (verified email included), `member` their users.info flags (the same cached
        answer), `team` our workspace, `shared` whether the channel is shared with another organisation."""
        if member is None or member.guest:
            return False
        if author.workspace in self.teams:  # listed by the operator: their people may be outside our workspace
            return True
        if member.outsider(team) is not None:  # another organisation's member, whatever email their profile shows
            return False
        if shared and author.workspace == team:
            return True
        _, at, domain = (author.email or "").rpartition("@")
        return bool(at) and domain.lower() in self.email_domains
