"""Telling people what the sender could not mend: a direct message to each channel's admins, and the texts of what
only the delivery side knows (a post that may be missing, one posted twice). A case's own texts are escalation's
(`escalation.views`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from agents.address import Platform
from agents.markup.text import escape
from bot.channels.messenger import Messenger

log = logging.getLogger(__name__)


class AdminAlerts:
    def __init__(self, *, messengers: Mapping[str, Messenger], admins: Mapping[Platform, frozenset[str]]) -> None:
        self.messengers = messengers
        self.admins = admins
        """By platform: the people each channel's messenger can send a direct message (ADMIN_USER_IDS in Slack,
        `8:orgid:<Entra object id>` in Teams)."""

    async def tell(self, text: str) -> None:
        """A direct message to each admin; best effort (each failure is logged), as it reports a failure."""
        for platform, admins in self.admins.items():
            messenger = self.messengers.get(platform)
            for admin in sorted(admins):
                try:
                    if messenger is None:
                        raise LookupError(f"{platform} is not configured")
                    await messenger.direct(admin, text)
                except Exception as exc:
                    log.error("could not tell admin %s about a failed delivery: %r", admin, exc)


def maybe_missing(*, conversation_id: int, kind: str, row_id: int, reader: str, error: str) -> str:
    """A post whose outcome is unknown, given up on a channel that cannot find its posts."""
    return (
        f":warning: A message of conversation {conversation_id} ({kind}, outbox row {row_id}) may not have reached "
        f"{reader}: {escape(error)}. Look there and repeat it if missing."
    )


def posted_twice(*, conversation_id: int, row_id: int, ts: str, error: Exception) -> str:
    return (
        f":warning: A message of conversation {conversation_id} (outbox row {row_id}) was posted twice and the "
        f"second ({escape(ts)}) could not be deleted: {escape(repr(error))}. Delete it by hand."
    )
