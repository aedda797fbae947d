"""The composition root: the whole bot built from the settings, in the order things depend on each other.

`running_bot` reads as the list of its parts: the database and the engine's brain, each configured channel's side
(`bot.slack.wiring`, `bot.teams.wiring`), the engine's conversations, the takeover (staff gate, case renderer,
desk, CSAT), delivery (the outbox's sender), the workers, intake, and each channel's app. Each part is one small
factory below; nothing is built at import time, and nothing here is used before it exists (the workers' doorbell
is made first, so that intake and the desk can ring it before the workers are).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING

from slack_bolt.app.async_app import AsyncApp
from sqlalchemy.ext.asyncio import AsyncEngine

from agents.address import Platform
from agents.conversations import Conversations, TurnHook
from agents.db.engine import make_engine, make_sessions, watch_writes
from agents.knowledge.store import KnowledgeBase
from agents.language import Language
from agents.leases import Leases, process_owner
from agents.model import Model
from agents.offline import FallbackModel, ProviderHealth
from agents.toolsets import SourceStatus
from bot.admin.actions import AdminActions
from bot.admin.command import AdminCommands, provider_probe
from bot.admin.queries import AdminQueries
from bot.channels.capabilities import Channels, ReplyStyle
from bot.channels.directories import Directories
from bot.channels.intake import Intake
from bot.channels.messenger import Messenger
from bot.csat import Csat, CsatPolicy
from bot.declaration.build import helpdesk as declared_helpdesk
from bot.delivery.owed import TurnOutbox
from bot.delivery.sender import OutboxSender
from bot.feedback import Feedback
from bot.metrics import Metrics
from bot.retention import Periods, Retention
from bot.runtime import startup as runtime
from bot.runtime.warmup import WarmUp, steps
from bot.runtime.workers import Doorbell, Progress, Workers
from bot.settings import Settings
from bot.slack.agent_view import Prompt
from bot.slack.channel import SLACK
from bot.slack.echoes import Echoes
from bot.slack.wiring import SlackSide, slack_side
from bot.staff import Colleagues, Member, Members, StaffGate, StaffList
from bot.teams.channel import TEAMS
from escalation.desk import CaseDesk
from escalation.machine import TAKEOVER
from escalation.policy import BusinessHours, EscalationPolicy
from escalation.render import CaseRenderer, Summarizer

if TYPE_CHECKING:
    from bot.teams.app import TeamsEdge
    from bot.teams.wiring import TeamsSide

log = logging.getLogger(__name__)
BOT_ACTOR = "helpdesk-bot"
"""Who the audit names when the bot itself acts on a case (hands back one that could not be posted)."""
RETENTION_EVERY_S = 300
"""How often retention erases what is past its period, a few bounded batches each time (bot.retention)."""


@dataclass
class Bot:
    settings: Settings
    db: runtime.Database
    app: AsyncApp | None
    """The Slack app; None when only Teams is configured."""
    workers: Workers
    metrics: Metrics
    conversations: Conversations
    desk: CaseDesk
    knowledge: KnowledgeBase
    warm_up: WarmUp
    """What the process loads before it says it is ready (the router's examples, the models): /healthz waits for it."""
    teams: TeamsEdge | None = None
    """`POST /api/messages`, when Teams is configured."""
    url: str = ""
    """Where the HTTP endpoints listen, once they do."""
    monitoring_url: str = ""
    """Where /healthz and /metrics are served: METRICS_HOST:METRICS_PORT, or `url` when METRICS_PORT is PORT."""
    provider: Callable[[], ProviderHealth] | None = None
    """How the LLM provider is doing (None offline): /healthz says degraded while it fails."""
    echoes: Echoes | None = None
    """The Slack app's own messages coming back, told apart before Bolt parses them; None without the Slack app."""


@dataclass(frozen=True)
class Sides:
    """The configured channels' parts; a channel not configured has none."""

    slack: SlackSide | None
    teams: TeamsSide | None
    channels: Channels = field(default_factory=lambda: Channels([SLACK, TEAMS]))
    """What each channel can do. A key that names no platform (tests', the playground's) is Slack's."""

    def messengers(self) -> list[Messenger]:
        return [side.messenger for side in (self.slack, self.teams) if side is not None]

    def directories(self) -> Directories:
        directories = Directories()
        if self.slack is not None:
            directories.register(SLACK.platform, self.slack.directory)
        if self.teams is not None:
            directories.register(TEAMS.platform, self.teams.directory)
        return directories

    def progress(
        self,
        settings: Settings,
        db: runtime.Database,
        metrics: Metrics,
        style: ReplyStyle,
        *,
        title: Callable[[str], str],
    ) -> list[Progress]:
        """What shows a turn while it works, in each channel that can: Slack's AI status, answers streamed (led by
        the handoff notices the outbox would post, `ReplyStyle.notice`)."""
        shown: list[Progress] = []

        def notice(agent: str, language: Language | None) -> str | None:
            return style.notice(title(agent), language)

        if self.slack is not None and SLACK.capabilities.ai_status:
            shown.append(self.slack.ai_status(failures=metrics.status_failures, title=title, texts=style.texts))
        if self.slack is not None and SLACK.capabilities.streaming and settings.stream_answers:
            shown.append(self.slack.streams(db.sessions, notice=notice, texts=style.texts))
        if self.teams is not None and TEAMS.capabilities.streaming and settings.stream_answers:
            shown.append(self.teams.streams(db.sessions, notice=notice, texts=style.texts))
        return shown

    def admins(self, settings: Settings) -> dict[Platform, frozenset[str]]:
        return {SLACK.platform: settings.admin_ids, TEAMS.platform: self.teams.admins if self.teams else frozenset()}


@dataclass(frozen=True)
class Takeover:
    staff: StaffGate
    cases: CaseRenderer
    desk: CaseDesk
    csat: Csat
    staff_channel_check: Callable[[], Awaitable[str | None]] | None
    """`/support status`'s look at the staff channel, where its platform has one (Slack)."""


@asynccontextmanager
async def running_bot(settings: Settings, *, clock: Callable[[], datetime] | None = None) -> AsyncIterator[Bot]:
    """Database migrated, workers running, the Slack app and the Teams edge ready (whichever are configured);
    everything stopped on exit."""
    assert settings.slack_configured or settings.teams_configured
    settings, helpdesk = declared_helpdesk(settings)
    if not settings.llm_configured:
        log.warning("no LLM provider configured: answering from the knowledge base (offline mode)")
    now = clock or (lambda: datetime.now(UTC))
    style = ReplyStyle(settings.texts, settings.working_reaction, settings.done_reaction)
    policy = escalation_policy(settings)
    async with runtime.open_database(settings) as db, AsyncExitStack() as closing:
        brain = await runtime.brain(settings, db, helpdesk)
        closing.push_async_callback(brain.close)
        # Side by side with the rest of the start-up; the process says it is ready once it is over (ready means warm).
        warm_up = WarmUp(
            steps(router=brain.router, knowledge=brain.knowledge, runs_turns=settings.process_role != "web")
        )
        warm_up.start()
        closing.push_async_callback(warm_up.stop)
        sides = Sides(
            slack=slack_side(settings) if settings.slack_configured else None,
            teams=teams_side(settings, db) if settings.teams_configured else None,
        )
        if sides.slack is not None:
            closing.push_async_callback(sides.slack.close)
        if sides.teams is not None:
            closing.push_async_callback(sides.teams.messenger.close)
        metrics, doorbell = Metrics(), Doorbell()
        leases = Leases(db.sessions, owner=process_owner(), ttl_s=settings.lease_seconds)
        after_turn = TurnOutbox(brain.roster, style, policy, channels=sides.channels, clock=now)
        conversations = engine(settings, db, brain, sides, metrics, leases, after_turn, closing)
        takeover = await takeover_parts(settings, db, brain, sides, policy, leases, doorbell, closing)
        sender = delivery(settings, db, sides, takeover)
        retention = Retention(db.sessions, Periods.of(settings))
        intake = Intake(
            sessions=make_sessions(await ack_engine(settings, db, closing)),
            conversations=conversations,
            channels=sides.channels,
            style=style,
            escalation=policy,
            metrics=metrics,
            on_stored=doorbell.ring_all,
            staff=takeover.staff,
            desk=takeover.desk,
            colleagues=Colleagues(settings.staff_teams, settings.staff_domains),
            customer_organisations=settings.customer_orgs,
        )
        workers = Workers(
            conversations=conversations,
            sender=sender,
            metrics=metrics,
            max_turns=settings.max_concurrent_turns,
            listen_url=runtime.listen_url(settings, db.url),
            housekeeping=[
                (intake.prune, 600),
                (lambda: takeover.desk.remind(now=now()), 30),
                (lambda: retention.run(now=now()), RETENTION_EVERY_S),
            ],
            enabled=settings.process_role != "web",
            progress=sides.progress(settings, db, metrics, style, title=lambda name: brain.roster.get(name).title),
            doorbell=doorbell,
        )
        await watch_monitoring(settings, db, brain, metrics, closing)
        app = edge = None
        if sides.slack is not None:
            app = await sides.slack.app(
                intake=intake,
                staff=takeover.staff,
                feedback=feedback(settings, db, takeover.desk),
                csat=takeover.csat,
                admin=admin_commands(settings, db, brain, takeover, sides.slack.directory),
                prompts=[Prompt(p.title, p.message) for p in helpdesk.declaration.spec.suggested_prompts],
            )
        if sides.teams is not None:
            teams_admin = admin_commands(settings, db, brain, takeover, NoMembers(), admin_ids=settings.teams_admins)
            edge = sides.teams.edge(intake=intake, admin=teams_admin, feedback=feedback(settings, db, takeover.desk))
        await workers.start()
        closing.push_async_callback(workers.stop)  # first out: the workers stop before what they use closes
        provider = brain.model.current_health if isinstance(brain.model, FallbackModel) else None
        yield Bot(
            settings,
            db,
            app,
            workers,
            metrics,
            conversations,
            takeover.desk,
            brain.knowledge,
            warm_up,
            edge,
            provider=provider,
            echoes=None if sides.slack is None or app is None else Echoes(sides.slack.authorisation),
        )


def teams_side(settings: Settings, db: runtime.Database) -> TeamsSide:
    """Teams' side of the bot, imported here rather than at the top: Microsoft's Agents SDK (~12 MB of RSS) is
    loaded only by a bot that Teams is configured for."""
    from bot.teams.wiring import teams_side

    return teams_side(settings, engine=db.engine, sessions=db.sessions)


def engine(
    settings: Settings,
    db: runtime.Database,
    brain: runtime.Brain,
    sides: Sides,
    metrics: Metrics,
    leases: Leases,
    after_turn: TurnHook,
    closing: AsyncExitStack,
) -> Conversations:
    """The engine's conversations: the queue, the turns, the transcript (the router and the language model they use
    are warmed by `Bot.warm_up`)."""
    conversations = Conversations(
        takeover=TAKEOVER,
        sessions=db.sessions,
        roster=brain.roster,
        model=brain.model,
        config=runtime.loop_config(settings, token_budget=brain.token_budget),
        after_turn=after_turn,
        leases=leases,
        limits=runtime.limits(settings),
        attachments=sides.slack.files if sides.slack is not None else None,
        summarising=runtime.summarising(settings, brain),
        on_summary=metrics.count_summary,
        router=brain.router,
    )
    if conversations.summaries is not None:
        closing.push_async_callback(conversations.summaries.close)
    return conversations


async def takeover_parts(
    settings: Settings,
    db: runtime.Database,
    brain: runtime.Brain,
    sides: Sides,
    policy: EscalationPolicy,
    leases: Leases,
    doorbell: Doorbell,
    closing: AsyncExitStack,
) -> Takeover:
    """Human takeover: who counts as staff (asked where the staff channel is), what cases show, the desk."""
    listed = StaffList(settings.staff_ids, settings.staff_usergroup_id)
    members: Members = NoMembers()
    check = None
    if sides.teams is not None and settings.staff_platform == TEAMS.platform:
        members = sides.teams.staff_members()
    elif sides.slack is not None:
        members = sides.slack.directory
        check = await sides.slack.staff_channel_check(listed)
    summarize = None
    if policy.llm_summary:
        summarizer = runtime.chat_model(settings)
        closing.push_async_callback(summarizer.close)
        summarize = llm_summarizer(runtime.provider_model(settings, summarizer), settings.openai_model)
    cases = CaseRenderer(
        sessions=db.sessions,
        directory=sides.directories(),
        summarize=summarize,
        name_suffix=settings.staff_name_suffix or "",
    )
    csat = Csat(sessions=db.sessions, policy=csat_policy(settings), channels=sides.channels)
    desk = CaseDesk(
        sessions=db.sessions,
        policy=policy,
        on_change=doorbell.ring_sender,
        leases=leases,
        after_resolve=csat.after_resolve,
    )
    return Takeover(StaffGate(members=members, listed=listed), cases, desk, csat, check)


def delivery(settings: Settings, db: runtime.Database, sides: Sides, takeover: Takeover) -> OutboxSender:
    """The outbox's one sender, through each configured channel's messenger."""
    desk = takeover.desk

    async def hand_back(escalation_id: int) -> object:
        return await desk.apply(escalation_id=escalation_id, action="hand_back", user=BOT_ACTOR)

    return OutboxSender(
        engine=db.engine,
        channels=sides.channels,
        messengers=sides.messengers(),
        staff_platform=settings.staff_platform,
        cases=takeover.cases,
        admins=sides.admins(settings),
        staff_channel=settings.staff_channel,
        texts=settings.texts,
        hand_back=hand_back,
        lease_s=settings.lease_seconds,
        feedback_buttons=settings.feedback_buttons,
        files=sides.slack.files if sides.slack is not None else None,
    )


async def ack_engine(settings: Settings, db: runtime.Database, closing: AsyncExitStack) -> AsyncEngine:
    """The acknowledgement path's own small pool, so a burst of events never queues behind the workers' short
    transactions for the platforms' few seconds."""
    pooled = make_engine(
        db.url, pool_size=settings.ack_pool_size, transaction_pooler=settings.database_pooler == "transaction"
    )
    watch_writes(pooled, db.writes)  # where a full disk shows first: the events the platforms send
    closing.push_async_callback(pooled.dispose)
    return pooled


async def watch_monitoring(
    settings: Settings, db: runtime.Database, brain: runtime.Brain, metrics: Metrics, closing: AsyncExitStack
) -> None:
    """Metrics read through a pool of their own: a scrape never waits behind turns, nor a turn behind a scrape."""
    pooled = make_engine(db.url, pool_size=1, transaction_pooler=settings.database_pooler == "transaction")
    closing.push_async_callback(pooled.dispose)
    metrics.watch(pooled)
    metrics.watch_sources(lambda: tool_statuses(brain))


def escalation_policy(settings: Settings) -> EscalationPolicy:
    return EscalationPolicy(
        staff_channel=settings.staff_channel,
        note_marker=settings.note_marker,
        hours=BusinessHours.parse(settings.business_hours, settings.business_timezone),
        texts=settings.texts,
        reminder_after_s=settings.case_reminder_minutes * 60,
        max_reminders=settings.case_max_reminders,
        llm_summary=settings.case_summary == "llm" and settings.llm_configured,
    )


def llm_summarizer(model: Model, model_name: str) -> Summarizer:
    async def summarize(lines: list[tuple[str, str]]) -> str:
        transcript = "\n".join(f"{who}: {text}" for who, text in lines)
        prompt = (
            "Summarise this customer-service conversation for the colleague taking it over: who the customer "
            "is, what they need, what was tried, and what is still open. At most four short bullet points."
        )
        response = await model.complete(
            model=model_name,
            messages=[{"role": "system", "content": prompt}, {"role": "user", "content": transcript}],
            tools=[],
        )
        return response.content or ""

    return summarize


def csat_policy(settings: Settings) -> CsatPolicy:
    return CsatPolicy(
        enabled=settings.csat,
        sample_rate=settings.csat_sample_rate,
        cooldown=timedelta(days=settings.csat_cooldown_days),
        texts=settings.texts,
    )


def feedback(settings: Settings, db: runtime.Database, desk: CaseDesk) -> Feedback:
    return Feedback(
        sessions=db.sessions,
        desk=desk,
        escalate_on_bad=settings.feedback_escalate_on_bad,
    )


class NoMembers:
    """Where a platform's directory is not there (no Slack): nobody is found, nobody is a workspace admin."""

    async def member(self, user: str) -> Member | None:
        return None

    async def usergroup(self, group: str) -> frozenset[str]:
        return frozenset()


def admin_commands(
    settings: Settings,
    db: runtime.Database,
    brain: runtime.Brain,
    takeover: Takeover,
    directory: Members,
    *,
    admin_ids: frozenset[str] | None = None,
) -> AdminCommands:
    """The /support commands: Slack's (ADMIN_USER_IDS, workspace admins when allowed) or, with `admin_ids`,
    Teams' (TEAMS_ADMIN_IDS: Entra object ids, nobody else)."""
    queries = AdminQueries(sessions=db.sessions)
    desk = takeover.desk
    return AdminCommands(
        members=directory,
        admin_ids=settings.admin_ids if admin_ids is None else admin_ids,
        workspace_admins=settings.admin_workspace_admins and admin_ids is None,
        queries=queries,
        actions=AdminActions(sessions=db.sessions, queries=queries, desk=desk, entry_agent=brain.roster.entry),
        roster=brain.roster,
        knowledge=brain.knowledge,
        probe=provider_probe(
            brain.provider, model=settings.openai_model, offline_in_outage=settings.llm_outage == "offline"
        ),
        version=version(),
        staff_channel=takeover.staff_channel_check,
        tool_sources=lambda: tool_statuses(brain),
        retention=Retention(db.sessions, Periods.of(settings)),
    )


def tool_statuses(brain: runtime.Brain) -> list[SourceStatus]:
    """How the operator's MCP servers and HTTP tools are doing, for /support status and /metrics."""
    return [source.status() for source in (brain.helpdesk.sources if brain.helpdesk else ())]


def version() -> str:
    try:
        return package_version("helpdesk-bot")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"
