"""Who wrote a message, as the platform vouched for it: the one value tools check ownership against.

The edge builds an `Author` from what the platform verified (Slack signs each event with the user's and the
workspace's ids; `users.info` adds the profile's name and email), keeps the email only where an organisation we
trust vouches for it (`vouched`), stores it with the message, and the engine
hands the author of the message being answered to every tool as `ToolContext.asker`. Nothing the model writes
ever becomes an `Author`: a tool that trusted a name or an email from its arguments would let anyone in a thread
act for anyone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Author:
    platform: str
    """"slack", or "cli" for the terminal chat (as `agents.address.Address.platform`)."""
    workspace: str | None
    """The author's own organisation (Slack team id, Teams tenant id), which in a Slack Connect channel or a Teams
    chat across tenants may be another company's."""
    user: str
    """The platform's id for the person (a Slack user id): stable, unlike names."""
    name: str | None = None
    """The display name, for people reading (and the model, in a shared thread); never proof of anything."""
    email: str | None = None
    """An email vouched for by our own organisation or one the operator lists as a customer organisation
    (`vouched`); None otherwise, whatever the profile says. The usual key to a shop's customer record."""
    locale: str | None = None
    """The person's locale as their platform gives it ("de-DE": a Teams activity's, Slack's `users.info`): the
    conversation's language until their words tell it (agents.conversations)."""

    @property
    def key(self) -> str:
        """One person, across conversations: what a tool compares to tell whether two messages came from the
        same person."""
        return f"{self.platform}:{self.workspace or '-'}:{self.user}"

    @property
    def label(self) -> str:
        return self.name or self.user

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> Author | None:
        if not raw or not raw.get("user"):
            return None
        return cls(
            str(raw.get("platform") or ""),
            raw.get("workspace"),
            str(raw["user"]),
            raw.get("name"),
            raw.get("email"),
            raw.get("locale"),
        )


def vouched(author: Author, *, organisation: str | None, ours: str | None, customers: frozenset[str]) -> Author:
    """`author` with its email kept only when `organisation` (the author's, as the platform's directory says) is
    `ours` or one of `customers` (CUSTOMER_ORGANISATIONS). Another organisation's admins set their people's
    profile emails as they like: such an email would open anyone's records, so tools get the ids alone."""
    trusted = organisation is not None and (organisation == ours or organisation in customers)
    return author if trusted or author.email is None else replace(author, email=None)


def asker_claims(asker: Author | None) -> dict[str, str]:
    """Who is asking, as the bot tells an operator's system (MCP request metadata, signed HTTP headers): only what
    the platform vouched for, never anything from the model's arguments. Empty when nobody is known."""
    if asker is None:
        return {}
    claims = {"platform": asker.platform, "workspace": asker.workspace or "", "user": asker.user, "key": asker.key}
    if asker.email:
        claims["email"] = asker.email
    if asker.name:
        claims["name"] = asker.name
    return claims
