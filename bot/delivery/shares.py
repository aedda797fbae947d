"""File relays where the channel shares files (`Capabilities.file_shares`): each file fetched from where it was
sent, uploaded again, and shared in one message with the relayed words. The uploads are recorded on the row before
they are shared, so that a share whose answer was lost is looked for, not made twice."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from agents.db.deliveries import FileRelay, Outcome
from agents.db.statements import Row
from agents.knowledge.readers import Unreadable
from bot.channels.messenger import FileFetcher, FileSharing, Refused
from bot.delivery.ledger import Ledger
from bot.delivery.messages import Messages
from escalation.views import files_not_shared

log = logging.getLogger(__name__)


class Shares:
    def __init__(self, *, ledger: Ledger, messages: Messages, files: FileFetcher) -> None:
        self.ledger = ledger
        self.messages = messages
        self.files = files
        """Fetches the files again, within its size limit."""

    async def share(
        self,
        row: Row,
        key: int,
        relay: FileRelay,
        messenger: FileSharing,
        *,
        words_alone: Callable[[], Awaitable[Outcome | None]],
    ) -> Outcome | None:
        """Relay a message's files: download each, upload it again, record the uploaded ids on the row, then share
        them in one message with the relayed words; None when it must wait. After an unknown outcome the files'
        shares are looked at before sharing again. A row in doubt without uploads tried the words alone, and goes
        on so (`words_alone`, the sender's post of the words and the files' names)."""
        uploaded: list[str] = list(row.uploaded or ())
        in_doubt = row.attempted_at is not None
        if in_doubt and not uploaded:
            return await words_alone()
        where = await self.messages.where(relay)
        if in_doubt and (ts := await messenger.find_share(where, uploaded)) is not None:
            return await self.ledger.done(row, Outcome.SENT, result_ts=ts)
        shared = await self.messages.renderer().shared_files(relay)
        if shared is None:
            return await self.ledger.done(row, Outcome.SKIPPED, last_error="deleted before it was relayed")
        left_out = [ref for ref in shared.files if self.files.too_big(ref)]
        if not uploaded:
            for ref in shared.files:
                try:
                    data = None if ref in left_out else await self.files.fetch(ref)
                except Unreadable as exc:  # deleted since, or refused: its name goes instead, nothing waits on it
                    log.warning("file %s not relayed: %s", ref.name, exc)
                    data = None
                if data is None:  # larger than the limit, as the platform declared it or as it turned out
                    left_out += [] if ref in left_out else [ref]
                    continue
                uploaded.append(await messenger.upload(ref.name, data))
            if not uploaded:  # nothing to share: the words go alone, with the files' names
                return await words_alone()
        comment = shared.comment.text
        if left_out:
            comment = files_not_shared(comment, [(ref.name, self.messages.not_shared(ref)) for ref in left_out])
        if await self.ledger.attempt(row, key, uploaded=uploaded) is None:
            return None
        try:
            ts = await messenger.share(where, uploaded, comment)
        except Refused as exc:
            if exc.certain:  # not shared: the next try shares the same uploads again, without looking
                await self.ledger.settled(row, key)
            raise
        return await self.ledger.done(row, Outcome.SENT, result_ts=ts)
