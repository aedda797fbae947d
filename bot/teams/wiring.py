"""Teams' part of the composition root (`bot.compose`): the SDK's credentials, the messenger, the directory and the
edge, from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core.authorization import AgentAuthConfiguration, AuthTypes
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.texts import Texts
from bot.admin.command import AdminCommands
from bot.channels.intake import Intake
from bot.channels.previews import Notice
from bot.feedback import Feedback
from bot.settings import Settings
from bot.teams.app import TeamsAuth, TeamsDirectory, TeamsEdge, TeamsMembers, TeamsPeople
from bot.teams.events import TeamsPolicy
from bot.teams.messenger import ServiceUrls, TeamsMessenger
from bot.teams.streaming import TeamsStreams

ENTRA_USER = "8:orgid:"
"""How Teams names a person in a conversation by their Entra object id (TEAMS_ADMIN_IDS lists object ids)."""


@dataclass(frozen=True)
class TeamsSide:
    policy: TeamsPolicy
    urls: ServiceUrls
    messenger: TeamsMessenger
    people: TeamsPeople
    directory: TeamsDirectory

    @property
    def admins(self) -> frozenset[str]:
        """TEAMS_ADMIN_IDS as the people the sender writes to when something needs an admin."""
        return frozenset(f"{ENTRA_USER}{admin}" for admin in self.policy.admins)

    def streams(self, sessions: async_sessionmaker[AsyncSession], *, notice: Notice, texts: Texts) -> TeamsStreams:
        """Answers streamed in personal chats (channels and group chats keep typing)."""
        return TeamsStreams(self.messenger, sessions, notice=notice, texts=texts)

    def staff_members(self) -> TeamsMembers:
        """Who is in the Teams staff channel (the staff gate asks there)."""
        assert self.policy.staff_channel is not None
        return self.people.in_conversation(self.policy.staff_channel)

    def edge(self, *, intake: Intake, admin: AdminCommands, feedback: Feedback | None = None) -> TeamsEdge:
        """`POST /api/messages`."""
        return TeamsEdge(
            policy=self.policy,
            auth=TeamsAuth(app_id=self.policy.app_id, tenant=self.policy.tenant),
            intake=intake,
            urls=self.urls,
            messenger=self.messenger,
            people=self.people,
            admin=admin,
            feedback=feedback,
        )


def teams_side(settings: Settings, *, engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]) -> TeamsSide:
    """Teams' side: the SDK's client credentials for outbound calls, where each conversation's service is."""
    assert settings.teams_app_id and settings.teams_tenant_id
    policy = TeamsPolicy(
        app_id=settings.teams_app_id,
        tenant=settings.teams_tenant_id,
        bot_name=settings.teams_bot_name,
        staff_channel=settings.teams_staff_channel_id,
        admins=settings.teams_admins,
    )
    urls = ServiceUrls(engine, default=settings.teams_service_url)
    messenger = TeamsMessenger(
        credentials=MsalAuth(teams_credentials(settings)),
        urls=urls,
        tenant=policy.tenant,
        bot_id=policy.bot_id,
        bot_name=policy.bot_name,
        feedback_loop=settings.feedback_buttons,
    )
    people = TeamsPeople(messenger, tenant=policy.tenant)
    return TeamsSide(policy, urls, messenger, people, TeamsDirectory(sessions))


def teams_credentials(settings: Settings) -> AgentAuthConfiguration:
    """The SDK's connection for the bot's own tokens: the app registration's client secret, or its certificate
    (a .pfx file, checked at start-up by the settings)."""
    if settings.teams_cert_pfx_file is not None:
        return AgentAuthConfiguration(
            auth_type=AuthTypes.certificate,
            client_id=settings.teams_app_id,
            tenant_id=settings.teams_tenant_id,
            cert_pfx_file=str(settings.teams_cert_pfx_file),
        )
    assert settings.teams_app_password is not None
    return AgentAuthConfiguration(
        auth_type=AuthTypes.client_secret,
        client_id=settings.teams_app_id,
        tenant_id=settings.teams_tenant_id,
        client_secret=settings.teams_app_password.get_secret_value(),
    )
