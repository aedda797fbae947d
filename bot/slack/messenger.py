"""The outbox's calls in Slack's Web API (`bot.channels.messenger.Messenger`).

Every post carries its outbox id in Slack's message metadata, which is how `find` tells, after an unknown outcome,
whether the post is already in its thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from datetime import datetime
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from agents.address import Platform
from agents.markup.limits import MESSAGE_TEXT, clip
from bot.channels.messenger import PreviewRef, Refused, Where
from escalation.views import Message

METADATA_TYPE = "helpdesk_outbox"
MAYBE_DONE = frozenset({"internal_error", "fatal_error", "request_timeout", "service_unavailable"})
"""Slack's errors that do not say the call was not done."""
UPLOAD_TIMEOUT_S = 60.0


class SlackMessenger:
    platform = Platform.SLACK

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        """Must retry nothing by itself (`slack_client(idempotent_only=True)`): a post retried after a lost answer
        inside the SDK could land twice, while one retried by the sender is first looked for; and a 429 waited out
        inside the client could outlive the send lease."""

    async def post(self, where: Where, message: Message, *, outbox_id: int) -> str:
        shown_as = message.shown_as
        response = await self._call(
            self.client.chat_postMessage(
                channel=where.channel,
                thread_ts=where.thread,
                text=message.text,
                blocks=message.blocks,
                username=shown_as.name if shown_as else None,
                icon_url=shown_as.avatar if shown_as else None,
                reply_broadcast=message.broadcast or None,
                metadata={"event_type": METADATA_TYPE, "event_payload": {"outbox_id": outbox_id}},
            )
        )
        return str(response["ts"])

    async def find(self, where: Where, *, outbox_id: int, since: datetime) -> str | None:
        """Searched from a minute before the row was written, so long threads are not read from their start."""
        oldest = f"{since.timestamp() - 60:.6f}"
        if where.thread:
            call = self.client.conversations_replies(
                channel=where.channel, ts=where.thread, oldest=oldest, include_all_metadata=True, limit=200
            )
        else:
            call = self.client.conversations_history(
                channel=where.channel, oldest=oldest, include_all_metadata=True, limit=200
            )
        response = await self._call(call)
        for message in response.get("messages") or []:
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == outbox_id:
                return str(message["ts"])
        return None

    async def finish_preview(self, preview: PreviewRef, where: Where, message: Message, *, outbox_id: int) -> str:
        """The streamed message becomes `message`: stopped with what the answer adds to what it showed (and the
        answer's other blocks, the feedback buttons), or, where it showed something else or can no longer be
        stopped, replaced by `chat.update`. The outbox mark goes on with the last call only, so a message `find`
        finds is one that is whole."""
        ts = preview.stream_id or await self._unmarked_stream(where, since=preview.started_at)
        if ts is None:  # its start never reached Slack: posted as any message
            return await self.post(where, message, outbox_id=outbox_id)
        mark = {"event_type": METADATA_TYPE, "event_payload": {"outbox_id": outbox_id}}
        markdown = "".join(b["text"] for b in message.blocks or () if b.get("type") == "markdown")
        others = [b for b in message.blocks or () if b.get("type") != "markdown"] or None
        whole = bool(markdown) and markdown.startswith(preview.shown) and message.shown_as is None
        rest = markdown[len(preview.shown) :] if whole else ""
        try:
            stopped = await self._call(
                self.client.chat_stopStream(
                    channel=where.channel,
                    ts=ts,
                    # A chunk, as the stream's own words went (`bot.slack.streaming`): Slack refuses the other mode.
                    chunks=[{"type": "markdown_text", "text": rest}] if rest else None,
                    blocks=others if whole else None,
                    metadata=mark if whole else None,
                )
            )
            if whole and (stopped.get("message") or {}).get("text", markdown) == markdown:
                return ts
        except Refused as exc:
            if exc.error != "message_not_in_streaming_state":  # expired: replaced below, as Slack advises
                raise
        await self._call(
            self.client.chat_update(
                channel=where.channel, ts=ts, text=message.text, blocks=message.blocks, metadata=mark
            )
        )
        return ts

    async def _unmarked_stream(self, where: Where, *, since: datetime) -> str | None:
        """A streamed message of ours in the thread that no outbox row has marked yet: a start whose answer was
        lost."""
        oldest = f"{since.timestamp() - 60:.6f}"
        response = await self._call(
            self.client.conversations_replies(
                channel=where.channel, ts=where.thread or "", oldest=oldest, include_all_metadata=True, limit=200
            )
        )
        for message in response.get("messages") or []:
            if message.get("streaming_state") and not message.get("metadata") and message.get("bot_id"):
                return str(message["ts"])
        return None

    async def upload(self, name: str, data: bytes) -> str:
        """files.getUploadURLExternal, then the bytes POSTed to the URL it gave (Slack answers 200 when it has
        them). Nothing is shared yet: an upload never completed is discarded by Slack."""
        got = await self._call(self.client.files_getUploadURLExternal(filename=name, length=len(data)))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=UPLOAD_TIMEOUT_S)) as http:
            form = aiohttp.FormData()
            form.add_field("file", data, filename=name)
            async with http.post(str(got["upload_url"]), data=form) as response:
                response.raise_for_status()  # an outcome like a lost answer: tried again after a backoff
        return str(got["file_id"])

    async def share(self, where: Where, file_ids: list[str], comment: str) -> str | None:
        response = await self._call(
            self.client.files_completeUploadExternal(
                files=[{"id": file_id} for file_id in file_ids],
                channel_id=where.channel,
                thread_ts=where.thread,
                initial_comment=comment,
            )
        )
        # Slack shares asynchronously: the share's ts is in the answer only when it is done already.
        for file in response.get("files") or []:
            if (ts := _share_ts(file, where)) is not None:
                return ts
        return None

    async def find_share(self, where: Where, file_ids: list[str]) -> str | None:
        """files.info of the first file: its `shares` name every channel (and thread) it was shared in."""
        response = await self._call(self.client.files_info(file=file_ids[0]))
        return _share_ts(response.get("file") or {}, where)

    async def delete_file(self, file_id: str) -> None:
        try:
            await self._call(self.client.files_delete(file=file_id))
        except Refused as exc:
            if exc.error != "file_not_found":  # deleted already (an earlier try, a colleague): done
                raise

    async def update(self, where: Where, message_id: str, message: Message) -> None:
        await self._call(
            self.client.chat_update(channel=where.channel, ts=message_id, text=message.text, blocks=message.blocks)
        )

    async def delete(self, where: Where, message_id: str) -> None:
        await self._call(self.client.chat_delete(channel=where.channel, ts=message_id))

    async def react(self, channel: str, message_id: str, name: str, *, add: bool) -> None:
        if add:
            await self._call(self.client.reactions_add(channel=channel, timestamp=message_id, name=name))
        else:
            await self._call(self.client.reactions_remove(channel=channel, timestamp=message_id, name=name))

    async def typing(self, where: Where) -> None:
        """Slack shows the working reaction instead."""

    async def notice(self, where: Where, user: str, text: str) -> None:
        await self._call(
            self.client.chat_postEphemeral(channel=where.channel, thread_ts=where.thread, user=user, text=text)
        )

    async def direct(self, user: str, text: str) -> None:
        await self._call(self.client.chat_postMessage(channel=user, text=clip(text, MESSAGE_TEXT)))

    @staticmethod
    async def _call(call: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
        try:
            return await call
        except SlackApiError as exc:
            # A JSON body the client could not parse leaves the raw aiohttp response here, with `status`.
            response = exc.response
            status = int(getattr(response, "status_code", None) or getattr(response, "status", 0) or 0)
            data = getattr(response, "data", None)
            error = str(data.get("error") or "") if isinstance(data, dict) else ""
            if not error and status >= 500:
                # A gateway's page, not Slack's answer: it says nothing about the call, like `internal_error`.
                error = "service_unavailable" if status == 503 else "internal_error"
            error = error or str(exc)
            retry_after = None
            if error == "ratelimited":
                retry_after = float(response.headers.get("Retry-After", 1) or 1)
            raise Refused(error, retry_after=retry_after, certain=error not in MAYBE_DONE and status < 500) from exc


def _share_ts(file: Mapping[str, Any], where: Where) -> str | None:
    """The ts of the message sharing `file` in `where`, from its `shares` (`public` and `private`, by channel)."""
    shares = file.get("shares") or {}
    for kind in ("public", "private"):
        for share in (shares.get(kind) or {}).get(where.channel) or []:
            if share.get("thread_ts") == where.thread:
                return str(share["ts"])
    return None
