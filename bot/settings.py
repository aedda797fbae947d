"""Settings, read once at start-up from the environment or `.env`.

Every variable is listed with a comment in `.env.example`; the README's configuration table mirrors it.
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from agents.address import Platform
from agents.loop import Texts
from agents.router import MIN_SCORE

_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

TEMPLATES = {
    "handoff_notice": frozenset({"agent"}),
    "off_hours_message": frozenset({"hours"}),
    "rate_limited_message": frozenset({"when"}),
}
"""The texts filled in with values, and the placeholders each may use; every other text is posted as written."""


class Settings(BaseSettings):
    # env_ignore_empty: `.env.example` copied as-is leaves `KEY=`, which means "not configured", not "empty".
    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore", env_ignore_empty=True)

    # The operator's declaration: agents, brand, texts, knowledge and tools (bot.declaration)
    helpdesk_file: Path | None = None
    """Unset: ./helpdesk.yaml when there is one, else the Driftwing sample."""

    # Storage
    database_url: str | None = Field(default=None, description="Postgres URL; unset starts an embedded one.")
    data_dir: Path = Field(default=Path(".data"), description="Local state (the embedded Postgres), from the cwd.")
    db_pool_size: int = 20
    ack_pool_size: int = 10
    database_pooler: Literal["session", "transaction"] = "session"
    database_listen_url: str | None = None
    migrate_at_start: bool = True
    """Each process brings the schema to this release's head as it starts (one at a time, under a lock). false: the
    release step does it (`python -m bot migrate`, the Procfile's release:) and processes only check it, so their
    database role needs no DDL rights."""

    # LLM provider
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    openai_model: str = "gpt-4o-mini"
    openai_timeout_s: float = 30.0
    openai_max_retries: int = 2
    openai_stream: bool = False
    embeddings: Literal["auto", "openai", "local", "none"] = "auto"
    embeddings_base_url: str | None = None
    embeddings_api_key: SecretStr | None = None
    embeddings_model: str = Field(
        default="text-embedding-3-small", validation_alias=AliasChoices("embeddings_model", "openai_embedding_model")
    )
    embeddings_dim: int | None = None
    kb_min_similarity: float = 0.35
    router_min_score: float | None = Field(default=MIN_SCORE, ge=0)
    """A message goes to a colleague without a model call when agents.router is at least this sure; `off`: never."""

    # Engine budgets, per customer message
    max_llm_calls_per_message: int = 8
    max_handoffs_per_message: int = 3
    max_parallel_tools: int = 4
    context_token_budget: int = 12_000
    history_tokens: int = Field(default=2_500, ge=0)
    """Unsummarised history (estimated tokens) above which older turns are folded into the running summary, until
    half is left (agents.summary); 0: no summaries."""
    summary_model: str | None = None
    """The model that writes the running summaries; unset: OPENAI_MODEL."""

    # Rate limits, per customer and per channel (0: off)
    rate_limit_user_per_minute: int = Field(default=10, ge=0)
    rate_limit_channel_per_minute: int = Field(default=120, ge=0)
    daily_token_budget_per_user: int = Field(default=1_000_000, ge=0)
    rate_limited_message: str = Texts.limited

    # Slack
    slack_bot_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_api_url: str = "https://slack.com/api/"
    staff_channel_id: str | None = None
    staff_user_ids: str = ""
    staff_usergroup_id: str | None = None
    """With either set, only the people listed (or in the group) act as staff; guests and external members never."""
    staff_team_ids: str = ""
    staff_email_domains: str = ""
    """Writers in customer threads who are colleagues, not customers (besides our own workspace's members in Slack
    Connect channels): comma-separated workspace ids, and domains of verified emails (`bot.staff.Colleagues`)."""
    staff_name_suffix: str | None = None
    """After a colleague's name on what they say to customers; unset: the declaration's brand (" (Acme team)");
    empty (`STAFF_NAME_SUFFIX=`): nothing."""
    admin_user_ids: str = ""
    admin_workspace_admins: bool = False
    admin_command: str = "/support"
    port: int = 3000
    host: str = "0.0.0.0"
    metrics_port: int | None = None
    """Set: /healthz and /metrics are served on METRICS_HOST:METRICS_PORT only, not on PORT."""
    metrics_host: str = "127.0.0.1"
    metrics_token: SecretStr | None = None
    """Set: /healthz and /metrics want `Authorization: Bearer <token>`."""
    slack_channels: str = ""
    slack_answer_bots: bool = False
    handoff_notice: str = "_Connecting you with {agent}…_"
    working_reaction: str = "eyes"
    done_reaction: str = "white_check_mark"
    feedback_buttons: bool = True
    """👍/👎 buttons under each AI answer in Slack (Block Kit feedback buttons)."""
    process_role: Literal["all", "web", "worker"] = "all"
    """web: receive and acknowledge (events, buttons, commands) only; worker: turns, the outbox and reminders
    only (with /healthz and /metrics). Split, acknowledgements never wait behind turns on one event loop."""
    max_concurrent_turns: int = Field(default=256, ge=0)
    """0: this process stores events and sends replies, and runs no turns (others do)."""
    lease_seconds: float = Field(default=30.0, gt=0)

    # Files customers attach (bot.files)
    max_file_bytes: int = Field(default=5_000_000, ge=0)
    """Larger files are not downloaded: the agent hears the file's name and that it could not be read."""
    max_file_chars: int = Field(default=20_000, ge=0)
    """Text read from one file (PDF, DOCX, TXT, MD) that the agent sees; the rest is cut."""
    model_accepts_images: bool = False
    """Images go to the model (`image_url` parts); off, the agent is told an image was sent (name and type)."""

    # Microsoft Teams: the 365 Agents SDK's own variables for the bot's Entra app registration
    teams_app_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices("teams_app_id", "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID"),
    )
    teams_app_password: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("teams_app_password", "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET"),
    )
    teams_tenant_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices("teams_tenant_id", "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID"),
    )
    teams_bot_name: str = "Helpdesk"
    """The bot's name in Teams (the manifest's): how its @mention reads in a channel post."""
    teams_staff_channel_id: str | None = None
    """Set: cases go to this Teams channel (`19:...@thread.tacv2`) instead of STAFF_CHANNEL_ID in Slack."""
    teams_admin_ids: str = ""
    """Entra object ids of the people who may use the /support commands in a personal chat with the bot."""
    teams_service_url: str = "https://smba.trafficmanager.net/teams/"
    """Where the bot posts in a tenant before anyone there has written to it (the staff channel's first case)."""

    # Human takeover
    escalation_message: str = Texts.escalated
    budget_message: str = Texts.budget
    """Told when the agents could not finish within a message's budgets and a colleague takes over."""
    provider_failure_message: str = Texts.provider_failure
    """Told when the LLM provider failed and a colleague takes over."""
    business_hours: str = ""
    business_timezone: str = "UTC"
    off_hours_message: str = "Our team is available {hours}; a colleague will reply as soon as they are back."
    resolved_message: str = "This conversation is now closed. If you need anything else, just write here again."
    paused_message: str = (
        "Our assistant is paused here for now, so I've passed your message to a colleague, who will reply here."
    )
    handed_back_message: str = "You're back with our assistant; ask away. A colleague is one message away if needed."
    case_unreachable_message: str = (
        "I'm sorry: I could not reach a colleague just now. Our team has been told about your request and will "
        "follow up here."
    )
    note_marker: str = "note:"
    case_reminder_minutes: float = 15
    case_max_reminders: int = 2
    case_summary: str = "llm"

    # Feedback on answers, and CSAT after a resolved case
    feedback_escalate_on_bad: bool = False
    """A 👎 on an answer opens a case for the conversation (as if the agent had escalated)."""
    csat: bool = True
    csat_question: str = "How did we do? Please rate the help you got from our team."
    csat_thanks: str = "Thank you for your rating!"
    csat_sample_rate: float = Field(default=1.0, ge=0, le=1)
    csat_cooldown_days: float = Field(default=7, ge=0)

    offline_greeting: str = (
        "Hello! I'm the assistant here. I can answer from our help articles, or bring in a colleague. What can I do "
        "for you?"
    )
    """What the offline stand-in (no LLM configured) says when it has nothing to search or route."""

    # Playground (`python -m bot playground`, or `run` without Slack credentials)
    playground_port: int = 8000

    log_level: str = "INFO"

    @property
    def llm_configured(self) -> bool:
        return self.openai_api_key is not None or self.openai_base_url is not None

    @property
    def embeddings_source(self) -> Literal["provider", "local", "none"]:
        """auto: the provider's embeddings when a key or an embeddings URL is set (a keyless OPENAI_BASE_URL is
        usually a local chat server, Ollama or vLLM, without the default embeddings model), else the local model."""
        if self.embeddings == "auto":
            keyed = self.embeddings_base_url or self.embeddings_api_key or self.openai_api_key
            return "provider" if keyed else "local"
        return {"openai": "provider", "local": "local", "none": "none"}[self.embeddings]  # type: ignore[return-value]

    @field_validator("router_min_score", mode="before")
    @classmethod
    def _router_off(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() == "off" else value

    @field_validator(*TEMPLATES)
    @classmethod
    def _template(cls, value: str, info: ValidationInfo) -> str:
        """Checked here, at start-up: a template that cannot be filled would fail every message it is used on."""
        allowed = TEMPLATES[str(info.field_name)]
        names = ", ".join("{" + name + "}" for name in sorted(allowed))
        hint = f"it may use {names}; write a literal brace as {{{{ or }}}}"
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as exc:
            raise ValueError(f"not a valid template ({exc}); {hint}") from None
        if unknown := used - allowed:
            raise ValueError(f"unknown placeholder {', '.join('{' + n + '}' for n in sorted(unknown))}; {hint}")
        try:
            value.format(**dict.fromkeys(allowed, ""))
        except (ValueError, IndexError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a valid template ({exc!r}); {hint}") from None
        return value

    @property
    def served_channels(self) -> frozenset[str]:
        return frozenset(part.strip() for part in self.slack_channels.split(",") if part.strip())

    @property
    def slack_configured(self) -> bool:
        return self.slack_bot_token is not None and self.slack_signing_secret is not None

    @property
    def teams_configured(self) -> bool:
        return self.teams_app_id is not None

    @property
    def staff_platform(self) -> Platform:
        return Platform.TEAMS if self.teams_staff_channel_id else Platform.SLACK

    @property
    def staff_channel(self) -> str | None:
        """The staff channel, on `staff_platform`."""
        return self.teams_staff_channel_id or self.staff_channel_id

    @property
    def teams_admins(self) -> frozenset[str]:
        return _ids(self.teams_admin_ids)

    @model_validator(mode="after")
    def _teams(self) -> Settings:
        """Checked at start-up, with the variable to set: a half-configured Teams would refuse every activity."""
        teams = {
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID": self.teams_app_id,
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET": self.teams_app_password,
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID": self.teams_tenant_id,
        }
        missing = [name for name, value in teams.items() if value is None]
        if missing and len(missing) < len(teams):
            raise ValueError(
                f"Teams is half configured: also set {', '.join(missing)} (README, Microsoft Teams set-up)"
            )
        for name, value in (("TENANTID", self.teams_tenant_id), ("CLIENTID", self.teams_app_id)):
            if value is not None and not _GUID.fullmatch(value):
                raise ValueError(f"CONNECTIONS__SERVICE_CONNECTION__SETTINGS__{name} must be a GUID, not {value!r}")
        if self.teams_staff_channel_id:
            if missing:
                raise ValueError(
                    "TEAMS_STAFF_CHANNEL_ID is set but Teams is not configured (the three CONNECTIONS__ variables)"
                )
            if self.staff_channel_id:
                raise ValueError(
                    "set one staff channel: STAFF_CHANNEL_ID (Slack) or TEAMS_STAFF_CHANNEL_ID (Teams), not both"
                )
            if not self.teams_staff_channel_id.startswith("19:"):
                raise ValueError(
                    'TEAMS_STAFF_CHANNEL_ID is a channel id such as 19:abc...@thread.tacv2 (from "Get link to channel")'
                )
        return self

    @property
    def admin_ids(self) -> frozenset[str]:
        return _ids(self.admin_user_ids)

    @property
    def staff_ids(self) -> frozenset[str]:
        return _ids(self.staff_user_ids)

    @property
    def staff_teams(self) -> frozenset[str]:
        return _ids(self.staff_team_ids)

    @property
    def staff_domains(self) -> frozenset[str]:
        return frozenset(domain.lower().lstrip("@") for domain in _ids(self.staff_email_domains))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env_file = dotenv_settings.env_file if isinstance(dotenv_settings, DotEnvSettingsSource) else None
        blank_env = _Blanks(settings_cls, EnvSettingsSource(settings_cls, env_ignore_empty=False))
        blank_dotenv = _Blanks(settings_cls, DotEnvSettingsSource(settings_cls, env_file, env_ignore_empty=False))
        return init_settings, env_settings, blank_env, dotenv_settings, blank_dotenv, file_secret_settings


class _Blanks(PydanticBaseSettingsSource):
    """The settings for which empty means "none" rather than "not set", where `source` has them empty."""

    FIELDS = frozenset({"staff_name_suffix"})

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: "" for name, value in self.source().items() if name in self.FIELDS and value == ""}


def _ids(listed: str) -> frozenset[str]:
    return frozenset(part.strip() for part in listed.split(",") if part.strip())


def env_name(field: str) -> str:
    """The variable a setting is documented under: its name, or the SDK's own spelling where it has one."""
    alias = Settings.model_fields[field].validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else []
    return next((str(c) for c in choices if isinstance(c, str) and c.isupper()), field.upper())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
