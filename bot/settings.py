"""Settings, read once at start-up from the environment or `.env`.

Every variable is listed with a comment in `.env.example` and in docs/configuration.md's table (both checked by
tests/test_settings.py).
"""

from __future__ import annotations

import ipaddress
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

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

HOSTED_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 600.0


def is_local_url(url: str | None) -> bool:
    """Whether a base URL names this machine or its own network rather than a hosted provider."""
    if not url:
        return False
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:  # not a URL the client could use either; it says so on the first call
        return False
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host or host.endswith((".local", ".internal", ".lan", ".localhost", ".ts.net"))
    # 100.64.0.0/10 (carrier-grade NAT) is where Tailscale and similar overlays put a machine of one's own.
    shared = address.version == 4 and address in ipaddress.ip_network("100.64.0.0/10")
    return address.is_loopback or address.is_private or address.is_link_local or shared


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
    openai_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds one model call may take. Unset: 60 for a hosted provider, 600 for a server on this machine or its
    network (`provider_is_local`): a small model on a CPU takes a minute or more for one answer."""
    openai_max_retries: int | None = Field(default=None, ge=0)
    """Retries of a failed call (the openai client's, with backoff). Unset: 2 hosted, 1 local (a local server that
    timed out is still busy with the call: retrying it twice only queues more of the same)."""
    llm_outage: Literal["human", "offline"] = "human"
    """What a customer gets while the provider fails (after the retries): `human`, an apology and a colleague;
    `offline`, the offline stand-in's answer from the knowledge base (it hands over when it finds nothing)."""
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
    customer_organisations: str = ""
    """Other organisations whose people's emails tools may trust (comma-separated Slack team ids, Teams tenant
    ids): their admins set those emails, so list only organisations that are your customers' own. Our own
    workspace and tenant always count (`agents.identity.vouched`)."""
    staff_name_suffix: str | None = None
    """After a colleague's name on what they say to customers; unset: the declaration's brand (" (Acme team)");
    empty (`STAFF_NAME_SUFFIX=`): nothing."""
    admin_user_ids: str = ""
    admin_workspace_admins: bool = False
    admin_command: str = "/support"
    port: int = 3000
    host: str = "0.0.0.0"
    metrics_port: int = Field(default=3001, ge=0, le=65535)
    """/healthz and /metrics are served on METRICS_HOST:METRICS_PORT, not on PORT (0: any free port, logged and in
    the ready line); PORT's own number: on the public listener after all, which wants METRICS_TOKEN. Not 9090:
    that is Prometheus's own port, and a Prometheus that scrapes loopback runs on this very host."""
    metrics_host: str = "127.0.0.1"
    """Loopback by default: what the database and the model are doing is nobody else's business."""
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

    # Files customers attach (bot.slack.files)
    max_file_bytes: int = Field(default=5_000_000, ge=0)
    """Larger files are not downloaded: the agent hears the file's name and that it could not be read."""
    max_file_chars: int = Field(default=20_000, ge=0)
    """Text read from one file (PDF, DOCX, TXT, MD) that the agent sees; the rest is cut."""
    model_accepts_images: bool = False
    """Images go to the model (`image_url` parts); off, the agent is told an image was sent (name and type)."""
    max_files_per_message: int = Field(default=5, ge=0)
    """Files of one message that are read; the agent hears the others' names, and that they were not read."""
    file_readers_at_once: int = Field(default=2, ge=1)
    """PDF and DOCX files read at once by one process, each in a process of its own; others wait their turn."""
    file_reader_memory_mb: int = Field(default=512, ge=64)
    """Memory (address space) of one reader process; a file that needs more is named to the agent as unread."""

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
    teams_cert_pfx_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("teams_cert_pfx_file", "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CERTPFXFILE"),
    )
    """Instead of the client secret: the app registration's certificate and its private key, one PKCS#12 (.pfx)
    file without a password, which the SDK's MSAL credentials sign their token requests with."""
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
    log_format: Literal["text", "json"] = "text"
    """json: one object per line (time, level, logger, message, conversation, message_id, exc_info), for a log
    shipper (bot.logs)."""

    @property
    def llm_configured(self) -> bool:
        return self.openai_api_key is not None or self.openai_base_url is not None

    @property
    def provider_is_local(self) -> bool:
        """OPENAI_BASE_URL names this machine or its own network (loopback, a private address, a one-label name such
        as compose's `ollama`, `.local`/`.internal`): a local inference server, slow and single-queued."""
        return is_local_url(self.openai_base_url)

    @property
    def llm_timeout_s(self) -> float:
        if self.openai_timeout_s is not None:
            return self.openai_timeout_s
        return LOCAL_TIMEOUT_S if self.provider_is_local else HOSTED_TIMEOUT_S

    @property
    def llm_max_retries(self) -> int:
        if self.openai_max_retries is not None:
            return self.openai_max_retries
        return 1 if self.provider_is_local else 2

    @property
    def embeddings_source(self) -> Literal["provider", "local", "none"]:
        """auto: the provider's embeddings when a key or an embeddings URL is set (a keyless OPENAI_BASE_URL is
        usually a local chat server, Ollama or vLLM, without the default embeddings model), else the local model."""
        if self.embeddings == "auto":
            keyed = self.embeddings_base_url or self.embeddings_api_key or self.openai_api_key
            return "provider" if keyed else "local"
        return {"openai": "provider", "local": "local", "none": "none"}[self.embeddings]  # type: ignore[return-value]

    @field_validator("*", mode="before")
    @classmethod
    def _secret_file(cls, value: object) -> object:
        """A NAME_FILE that could not be used (`_SecretFiles`) fails here, so that it is reported with the other
        problems, under its setting."""
        if isinstance(value, _Unusable):
            raise ValueError(value.problem)
        return value

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

    @property
    def metrics_on_public_port(self) -> bool:
        """METRICS_PORT=PORT: /healthz and /metrics on the public listener (0 is "any free port" for each)."""
        return self.metrics_port != 0 and self.metrics_port == self.port

    @model_validator(mode="after")
    def _monitoring(self) -> Settings:
        """Monitoring is never open on the public port: there it wants a token, checked here at start-up."""
        if self.metrics_on_public_port and self.metrics_token is None:
            raise ValueError(
                f"METRICS_PORT={self.metrics_port} is PORT: /healthz and /metrics would be open to anyone who reaches "
                "the bot; set METRICS_TOKEN too, or another METRICS_PORT"
            )
        return self

    @model_validator(mode="after")
    def _teams(self) -> Settings:
        """Checked at start-up, with the variable to set: a half-configured Teams would refuse every activity."""
        if self.teams_app_password is not None and self.teams_cert_pfx_file is not None:
            raise ValueError(
                "set one Teams credential: CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET or "
                "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CERTPFXFILE, not both"
            )
        teams = {
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID": self.teams_app_id,
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET (or …__CERTPFXFILE)": self.teams_app_password
            or self.teams_cert_pfx_file,
            "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID": self.teams_tenant_id,
        }
        missing = [name for name, value in teams.items() if value is None]
        if missing and len(missing) < len(teams):
            raise ValueError(f"Teams is half configured: also set {', '.join(missing)} (docs/teams.md)")
        for name, value in (("TENANTID", self.teams_tenant_id), ("CLIENTID", self.teams_app_id)):
            if value is not None and not _GUID.fullmatch(value):
                raise ValueError(f"CONNECTIONS__SERVICE_CONNECTION__SETTINGS__{name} must be a GUID, not {value!r}")
        if self.teams_cert_pfx_file is not None and (problem := _pfx_problem(self.teams_cert_pfx_file)):
            raise ValueError(
                f"CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CERTPFXFILE={self.teams_cert_pfx_file}: {problem}"
            )
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
    def customer_orgs(self) -> frozenset[str]:
        return _ids(self.customer_organisations)

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
        files = _SecretFiles(
            settings_cls, EnvSettingsSource(settings_cls), DotEnvSettingsSource(settings_cls, env_file)
        )
        return init_settings, files, env_settings, blank_env, dotenv_settings, blank_dotenv, file_secret_settings


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


def secret_settings() -> frozenset[str]:
    """The settings that may be read from a file (NAME_FILE): every SecretStr, and the database URLs, which hold a
    password."""
    secret = {
        name
        for name, field in Settings.model_fields.items()
        if SecretStr in (field.annotation, *get_args(field.annotation))
    }
    return frozenset(secret | {"database_url", "database_listen_url"})


@dataclass(frozen=True)
class _Unusable:
    problem: str


class _SecretFiles(PydanticBaseSettingsSource):
    """NAME_FILE=/run/secrets/x, for a secret setting NAME (under any of its names): the value is that file's text
    less one trailing newline, as container and Kubernetes secrets are mounted. Looked for where NAME is, in the
    environment and `.env`; both set, or a file that cannot be read, stops the start with the variable named."""

    def __init__(self, settings_cls: type[BaseSettings], *sources: EnvSettingsSource) -> None:
        super().__init__(settings_cls)
        self.sources = sources

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def _given(self, variable: str) -> str | None:
        # Not case sensitive, as the settings are: the sources hold their variables' names lower-cased.
        return next((value for source in self.sources if (value := source.env_vars.get(variable.lower()))), None)

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name in sorted(secret_settings()):
            names = [name.upper(), env_name(name)]
            variable, path = next(((f"{n}_FILE", p) for n in names if (p := self._given(f"{n}_FILE"))), ("", None))
            if path is None:
                continue
            if given := next((n for n in names if self._given(n)), None):
                found[name] = _Unusable(f"{given} and {variable} are both set: keep one")
            else:
                found[name] = _read_secret(variable, Path(path))
        return found


def _read_secret(variable: str, path: Path) -> str | _Unusable:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _Unusable(f"{variable}={path}: no such file")
    except OSError as exc:
        return _Unusable(f"{variable}={path}: cannot be read ({exc.strerror or exc})")
    except UnicodeDecodeError:
        return _Unusable(f"{variable}={path}: not UTF-8 text")
    value = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
    return value if value else _Unusable(f"{variable}={path}: the file is empty")


def _pfx_problem(path: Path) -> str | None:
    """What keeps the SDK from signing with this file, read as it reads it (MSAL: PKCS#12, no password)."""
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    try:
        key, certificate, _ = pkcs12.load_key_and_certificates(data, None)
    except ValueError:
        return (
            "not a PKCS#12 (.pfx) file without a password, which is what the Agents SDK reads "
            "(openssl pkcs12 -export -inkey key.pem -in cert.pem -passout pass: -out bot.pfx)"
        )
    if key is None or certificate is None:
        return "the file must hold both the certificate and its private key"
    return None


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
