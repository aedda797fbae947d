"""Slack's `/support` listener: ack at once, run the command (`bot.admin.command`), answer ephemerally through the
response_url."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.admin.command import AdminCommands, Invocation

log = logging.getLogger(__name__)


def invocation_of(command: Mapping[str, Any]) -> Invocation:
    """A slash command's payload as the admin commands take it."""
    return Invocation(
        str(command.get("user_id", "")),
        command.get("channel_id"),
        command.get("team_id"),
        command.get("team_domain"),
        str(command.get("text") or ""),
    )


def register(app: AsyncApp, commands: AdminCommands, *, name: str = "/support") -> None:
    @app.command(name)
    async def support(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        # Ack first, empty: Slack's 3 seconds are for the ack; the answer follows on the response_url.
        await ack()
        reply = await commands.run(invocation_of(command))
        sent = await respond(text=reply.text, blocks=reply.blocks, response_type="ephemeral", replace_original=False)
        if sent.status_code != 200:  # Slack refused the blocks: the answer still gets through, as plain text
            log.warning("response_url refused the blocks (%s %s); sending text", sent.status_code, sent.body)
            await respond(text=reply.text[:3000], response_type="ephemeral", replace_original=False)
