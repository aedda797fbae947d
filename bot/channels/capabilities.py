"""What a channel can do, as values: shared code (intake, delivery, takeover, CSAT) asks a channel's capabilities and
never which platform it is. Each channel's folder declares its own (`bot.slack.channel.SLACK`,
`bot.teams.channel.TEAMS`), and the composition root hands them over as one `Channels`; a third channel is one
more declaration, and no shared module changes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from agents.address import Address, Platform
from agents.language import Language
from agents.texts import Text, Texts


@dataclass(frozen=True)
class Capabilities:
    reactions: bool
    """The bot can react to a message (Slack): the working 👀 and the done ✅ on a customer's message, 📝 on a
    colleague's note. Without them, the "being handled" signal is the typing indicator."""
    typing: bool
    """A typing indicator the bot can show while a turn works (Teams)."""
    ai_status: bool
    """An assistant status line under the thread (Slack's `assistant.threads.setStatus`)."""
    file_shares: bool
    """Files can be uploaded and shared in one message with a comment; elsewhere a relay carries their names."""
    finds_posts: bool
    """The platform can say whether a post went out (Slack's message metadata), so a post whose outcome is unknown
    is looked for before it is tried again; elsewhere it is never posted twice, and a person is told."""
    surveys: bool
    """Buttons whose clicks come back to the bot as the customer's (CSAT after a resolved case)."""
    rich_answers: bool
    """An agent's answer is kept as the model's Markdown and rendered when it is sent (Slack's markdown block with
    feedback buttons); elsewhere it is stored as the posts the channel shows."""
    streaming: bool = False
    """Answers can be shown while the model writes them."""


@dataclass(frozen=True)
class ReplyStyle:
    """How the bot shows its work where a channel lets it (the operator's choice of notice and reactions)."""

    texts: Texts = field(default_factory=Texts)
    """The handoff notice among them, in each language; `{agent}` is the agent's title. Empty: no notice."""
    working_reaction: str = "eyes"
    done_reaction: str = "white_check_mark"

    def notice(self, title: str, language: Language | None) -> str | None:
        """The notice of a handoff to the agent titled `title`, as the customer is shown it in `language` (posted, or
        leading a streamed answer: the two must read the same); None when there is none."""
        notice = self.texts.get(Text.HANDOFF_NOTICE, language)
        return notice.format(agent=title) if notice else None


class Format(Protocol):
    def posts(self, body: str) -> list[str]:
        """Markdown (an agent's answer, a notice) as this channel shows it, nothing in it a mention or a disguised
        link, in as many posts as its length needs."""
        ...


@dataclass(frozen=True)
class Channel:
    """A channel as shared code sees it: which platform, what it can do, how it writes text. No clients: the
    channel's messenger and app are built by the composition root."""

    platform: Platform
    capabilities: Capabilities
    format: Format


class Channels:
    """The channels this bot knows, by platform. A conversation's key names its platform; a key that names none
    (tests', the playground's) belongs to the first channel given."""

    def __init__(self, channels: Iterable[Channel]) -> None:
        # Platform is a StrEnum: a key's platform, read as a string, finds its channel.
        self._by_platform: dict[str, Channel] = {channel.platform: channel for channel in channels}
        if not self._by_platform:
            raise ValueError("at least one channel")
        self.default = next(iter(self._by_platform.values()))

    def of(self, platform: Platform | str) -> Channel:
        """The channel of a platform. One not registered here is shown as the default channel would show it (its
        capabilities, its format); the sender has no messenger for it, and gives its rows up."""
        return self._by_platform.get(platform, self.default)

    def platform_of_key(self, key: str | None) -> str:
        """The platform a conversation's key names (the default channel's for a key that names none)."""
        address = Address.parse(key) if key else None
        return address.platform if address is not None else self.default.platform

    def of_key(self, key: str | None) -> Channel:
        return self.of(self.platform_of_key(key))

    def __iter__(self) -> Iterator[Channel]:
        return iter(self._by_platform.values())
