"""Start-up checks of what the configuration points at in Slack: problems found before the first customer does.

The staff channel is checked once at start-up, and again by each `/support status`. Shared with another
organisation (Slack Connect), it would show every case (the customer's words, the summary, internal notes) to
people outside the company: the bot refuses to start. Every other problem (no such channel, archived, the bot not a
member, public to the whole workspace with no staff allow-list) is logged loudly and shown by `/support status`,
but the bot starts: customers are still answered, a case that cannot be posted reaches the admins by direct
message, and inviting the bot fixes it without a restart.
"""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)


class RefusedToStart(Exception):
    """The configuration would do harm if the bot ran with it; the message says what and how to fix it."""


async def staff_channel_problem(client: AsyncWebClient, channel: str | None, *, allow_list: bool) -> str | None:
    """What is wrong with the staff channel, or None; raises RefusedToStart when it is shared outside.
    `allow_list`: STAFF_USER_IDS or STAFF_USERGROUP_ID says who is staff, so a public channel is less grave."""
    if not channel:
        return "STAFF_CHANNEL_ID is not set: escalated conversations wait for a person nobody is told about"
    try:
        info = (await client.conversations_info(channel=channel))["channel"]
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error == "channel_not_found":
            return f"STAFF_CHANNEL_ID {channel}: no such channel, or a private one the bot is not in (invite it)"
        return f"the staff channel {channel} could not be checked ({error})"
    except Exception as exc:  # Slack unreachable at start-up: not a reason to stay down
        return f"the staff channel {channel} could not be checked ({type(exc).__name__})"
    if info.get("is_ext_shared") or info.get("is_pending_ext_shared"):
        raise RefusedToStart(
            f"STAFF_CHANNEL_ID {channel} (#{info.get('name')}) is shared with another organisation: every case, "
            "summary and internal note would be shown to them. Use a channel only your company is in."
        )
    if info.get("is_archived"):
        return f"the staff channel #{info.get('name')} is archived: unarchive it or set another STAFF_CHANNEL_ID"
    if not info.get("is_member"):
        return f"the bot is not in the staff channel #{info.get('name')}: invite it (`/invite @bot`)"
    if not info.get("is_private") and not allow_list:
        return (
            f"THE STAFF CHANNEL #{info.get('name')} IS PUBLIC and no staff allow-list is set: anyone in the "
            "workspace who joins it can read the cases, reply to customers and claim, resolve or hand back cases. "
            "Make it private, or set STAFF_USER_IDS or STAFF_USERGROUP_ID."
        )
    return None


async def staff_channel_status(client: AsyncWebClient, channel: str | None, *, allow_list: bool) -> str | None:
    """The problem with the staff channel as `/support status` shows it (being shared outside among them)."""
    try:
        return await staff_channel_problem(client, channel, allow_list=allow_list)
    except RefusedToStart as exc:
        return str(exc)
