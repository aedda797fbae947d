"""The App Home: the last day's numbers and the bot's state for admins and staff, a short note for everyone else.
Published (`views.publish`) each time someone opens it, so it is as fresh as that. Staff means listed in
STAFF_USER_IDS / STAFF_USERGROUP_ID: without a list every member may press case buttons, but not see the numbers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from agents.language import Language
from agents.texts import Text, Texts
from bot.admin import views
from bot.admin.command import AdminCommands
from bot.staff import StaffGate, Standing


class Home:
    def __init__(
        self,
        *,
        client: AsyncWebClient,
        admin: AdminCommands,
        staff: StaffGate,
        texts: Texts | None = None,
        locale: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        self.client = client
        self.admin = admin
        self.staff = staff
        self.texts = texts or Texts()
        """Its home note, in the language of the person's Slack locale (`locale`), else the operator's."""
        self.locale = locale

    async def publish(self, user: str, *, team: str | None) -> None:
        await self.client.views_publish(user_id=user, view={"type": "home", "blocks": await self.blocks(user, team)})

    async def blocks(self, user: str, team: str | None) -> list[dict[str, Any]]:
        if not await self._insider(user, team):
            try:
                locale = await self.locale(user) if self.locale is not None else None
            except Exception:  # Slack did not say: the operator's language
                locale = None
            return views.plain_home_blocks(self.texts.get(Text.HOME_NOTE, Language.parse(locale)))
        usage, health, llm, knowledge = await asyncio.gather(
            self.admin.queries.usage(1), self.admin.database_health(), self.admin.probe(), self.admin.knowledge_status()
        )
        return views.home_blocks(usage, health, llm=llm, knowledge=knowledge)

    async def _insider(self, user: str, team: str | None) -> bool:
        """An admin, or staff by the allow-list (without one, every member counts as staff for case buttons, and
        the numbers are not for every member)."""
        if await self.admin.is_admin(user, team=team):
            return True
        if not self.staff.listed.restricts:
            return False
        try:
            return await self.staff.standing(user, team=team) == Standing.STAFF
        except Exception:  # Slack did not say: the plain home, nothing of the numbers
            return False
