"""`python -m bot teams-package`: the Teams app package, a zip of manifest.json, color.png and outline.png that an
admin uploads to Teams.

The template is `teams/manifest.json` in a checkout (`bot/teams/manifest/` once installed, pyproject's package-dir). Its
placeholders ({{APP_ID}}, {{APP_NAME}}, {{HOST}}, {{DEVELOPER_NAME}}, {{WEBSITE_URL}}, {{PRIVACY_URL}}, {{TERMS_URL}})
are filled in string values, never in the JSON text, so a name with quotes stays a name. The admin commands are not
in the template: they are added from `bot.admin.parse.USAGE`, so that Teams suggests what `/support` answers.

Everything is checked before anything is written, and all problems are reported at once: the inputs (a GUID app id,
a host), then the filled manifest against what Teams requires (fields, lengths, the bot's id, scopes and
resource-specific consent) and the icons' sizes read from their PNG headers.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import struct
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.admin.parse import USAGE

APP_ID_VARIABLE = "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID"
"""The Agents SDK's variable for the Entra app registration's client id: the Teams app id and the bot id too."""
DEFAULT_NAME = "Helpdesk"
"""When no declaration names the app (its brand's `teams_app_name`)."""
DEFAULT_OUT = Path("teams-app.zip")
ADMIN_COMMANDS = ("help", "status", "conversations", "show", "escalations", "pause", "resume", "kb", "stats", "tools")
"""Suggested in the personal chat, where admins type them; Teams shows at most 12 per scope."""
SCOPES = frozenset({"personal", "team", "groupChat"})
RSC_PERMISSIONS = ("ChannelMessage.Read.Group", "ChatMessage.Read.Chat")
"""Without them Teams sends the bot only the messages that @mention it: no follow-up in a channel reply chain or a
group chat would reach the conversation."""
ICON_SIDES = {"color": 192, "outline": 32}
"""Pixels, width and height, by the manifest's `icons` key."""
MAX_LENGTHS = {
    ("name", "short"): 30,
    ("name", "full"): 100,
    ("description", "short"): 80,
    ("description", "full"): 4000,
    ("developer", "name"): 32,
    ("developer", "websiteUrl"): 2048,
    ("developer", "privacyUrl"): 2048,
    ("developer", "termsOfUseUrl"): 2048,
    ("webApplicationInfo", "resource"): 2048,
}
"""Teams' limits (app manifest schema), in characters."""
OPTIONAL = frozenset({("name", "full")})
REQUIRED = ("manifestVersion", "version", "id", "developer", "name", "description", "icons", "accentColor", "bots")
MAX_COMMAND_TITLE = 32
MAX_COMMAND_DESCRIPTION = 128
MAX_COMMANDS = 12
MAX_VALID_DOMAINS = 16

_GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
_HEX_COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")
_DOMAIN = re.compile(r"^(?=.{1,253}$)(?:\*\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_PLACEHOLDER = re.compile(r"\{\{[A-Z_]+\}\}")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_ALPHA_TYPES = (4, 6)  # grey + alpha, RGBA
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the same inputs give the same bytes


def _template_dir() -> Path:
    here = Path(__file__).resolve().parent
    installed = here / "manifest"
    return installed if installed.is_dir() else here.parent.parent / "teams"


TEMPLATE_DIR = _template_dir()


class PackageError(Exception):
    """The package cannot be made; `problems` says why, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _SdkVariables(BaseSettings):
    """The SDK's app id, from the environment or `.env`, read as the bot reads its settings."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore", env_ignore_empty=True)
    app_id: str | None = Field(default=None, validation_alias=APP_ID_VARIABLE)


@dataclass(frozen=True)
class AppDetails:
    """What the template's placeholders are filled with."""

    app_id: str
    """The Entra app registration's Application (client) ID, lower-case."""
    host: str
    """The public host name where `/api/messages` is served, without scheme or path."""
    name: str
    developer: str
    website_url: str
    privacy_url: str
    terms_url: str
    version: str | None = None
    """The app's version, when not the template's: Teams installs an update only when it is higher."""

    def placeholders(self) -> dict[str, str]:
        return {
            "{{APP_ID}}": self.app_id,
            "{{APP_NAME}}": self.name,
            "{{HOST}}": self.host,
            "{{DEVELOPER_NAME}}": self.developer,
            "{{WEBSITE_URL}}": self.website_url,
            "{{PRIVACY_URL}}": self.privacy_url,
            "{{TERMS_URL}}": self.terms_url,
        }


def host_name(value: str) -> str | None:
    """`bot.example.com` or `https://bot.example.com[/]` as `bot.example.com`; None when it is not such a host."""
    text = value.strip().lower()
    text = text.removeprefix("https://").rstrip("/")
    return text if _DOMAIN.match(text) and not text.startswith("*.") else None


def app_details(
    *,
    app_id: str | None,
    host: str | None,
    name: str = DEFAULT_NAME,
    developer: str | None = None,
    website_url: str | None = None,
    privacy_url: str | None = None,
    terms_url: str | None = None,
    version: str | None = None,
) -> AppDetails:
    """The inputs checked, with their defaults: the developer is the app, every URL the host's home page."""
    problems = []
    if not app_id:
        problems.append(f"no app id: pass --app-id or set {APP_ID_VARIABLE} (the app registration's client id)")
    elif not _GUID.match(app_id.strip().lower()):
        problems.append(f"app id {app_id!r} is not a GUID such as 00000000-0000-0000-0000-000000000000")
    if not host:
        problems.append("no host: pass --host, the public host name where the bot serves /api/messages")
    elif host_name(host) is None:
        problems.append(f"host {host!r} is not a public host name (e.g. bot.example.com; https only, no path or port)")
    if problems or app_id is None or host is None:
        raise PackageError(problems)
    domain = host_name(host) or ""
    website = website_url or f"https://{domain}/"
    return AppDetails(
        app_id=app_id.strip().lower(),
        host=domain,
        name=name.strip(),
        developer=(developer or name).strip(),
        website_url=website,
        privacy_url=privacy_url or website,
        terms_url=terms_url or website,
        version=version,
    )


def _filled(value: Any, placeholders: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for placeholder, text in placeholders.items():
            value = value.replace(placeholder, text)
        return value
    if isinstance(value, list):
        return [_filled(item, placeholders) for item in value]
    if isinstance(value, dict):
        return {key: _filled(item, placeholders) for key, item in value.items()}
    return value


def admin_commands() -> list[dict[str, str]]:
    return [{"title": name, "description": USAGE[name][1]} for name in ADMIN_COMMANDS]


def manifest(template: Mapping[str, Any], details: AppDetails) -> dict[str, Any]:
    """The template filled in, with the admin commands for the personal scope."""
    filled: dict[str, Any] = _filled(template, details.placeholders())
    if details.version:
        filled["version"] = details.version
    for bot in filled.get("bots", []):
        bot["commandLists"] = [{"scopes": ["personal"], "commands": admin_commands()}]
    return filled


def png_header(data: bytes) -> tuple[int, int, int] | None:
    """Width, height and colour type from a PNG's IHDR chunk; None when the data is not a PNG."""
    if len(data) < 26 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height, _depth, colour_type = struct.unpack(">IIBB", data[16:26])
    return width, height, colour_type


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}" if path else key)


def _field_problems(app: Mapping[str, Any]) -> Iterator[str]:
    for key in REQUIRED:
        if not app.get(key):
            yield f"the manifest has no {key}"
    if not _GUID.match(str(app.get("id", ""))):
        yield "id is not a GUID"
    if not _SEMVER.match(str(app.get("version", ""))):
        yield f"version {app.get('version')!r} is not MAJOR.MINOR.PATCH such as 1.0.1"
    if not _HEX_COLOUR.match(str(app.get("accentColor", ""))):
        yield "accentColor is not a colour such as #1D3557"
    for (group, field), limit in MAX_LENGTHS.items():
        text = app.get(group, {}).get(field)
        if text is None and (group, field) not in OPTIONAL:
            yield f"{group}.{field} is missing"
        elif text is not None and not 0 < len(text) <= limit:
            yield f"{group}.{field} has {len(text)} characters; Teams takes 1 to {limit}"
    for field in ("websiteUrl", "privacyUrl", "termsOfUseUrl"):
        if not str(app.get("developer", {}).get(field, "")).startswith("https://"):
            yield f"developer.{field} is not an https:// URL"
    for path, text in _strings(app):
        if _PLACEHOLDER.search(text):
            yield f"{path} still has a placeholder: {text!r}"


def _bot_problems(app: Mapping[str, Any]) -> Iterator[str]:
    bots = app.get("bots", [])
    if len(bots) != 1:
        yield f"the manifest has {len(bots)} bots; the helpdesk is one"
        return
    bot = bots[0]
    if bot.get("botId") != app.get("id"):
        yield "bots[0].botId differs from id: both are the app registration's client id"
    if set(bot.get("scopes", [])) != SCOPES:
        yield f"bots[0].scopes must be {sorted(SCOPES)}"
    for listing in bot.get("commandLists", []):
        commands = listing.get("commands", [])
        if len(commands) > MAX_COMMANDS:
            yield f"a command list has {len(commands)} commands; Teams shows at most {MAX_COMMANDS}"
        for command in commands:
            if not 0 < len(command.get("title", "")) <= MAX_COMMAND_TITLE:
                yield f"command title {command.get('title')!r} is not 1 to {MAX_COMMAND_TITLE} characters"
            if not 0 < len(command.get("description", "")) <= MAX_COMMAND_DESCRIPTION:
                yield f"command {command.get('title')!r}: description is not 1 to {MAX_COMMAND_DESCRIPTION} characters"
    web_app = app.get("webApplicationInfo", {})
    if web_app.get("id") != app.get("id"):
        yield "webApplicationInfo.id differs from id: resource-specific consent is granted to the app registration"
    granted = [p.get("name") for p in app.get("authorization", {}).get("permissions", {}).get("resourceSpecific", [])]
    for permission in RSC_PERMISSIONS:
        if permission not in granted:
            yield f"authorization.permissions.resourceSpecific lacks {permission}: follow-ups would need a mention"


def _domain_problems(app: Mapping[str, Any], host: str) -> Iterator[str]:
    domains = app.get("validDomains", [])
    if len(domains) > MAX_VALID_DOMAINS:
        yield f"validDomains has {len(domains)} entries; Teams takes {MAX_VALID_DOMAINS}"
    for domain in domains:
        if not _DOMAIN.match(domain):
            yield f"validDomains entry {domain!r} is not a domain name (no scheme, path or port)"
    if host not in domains:
        yield f"validDomains does not list the host {host}"


def icon_problems(app: Mapping[str, Any], icons: Mapping[str, bytes]) -> Iterator[str]:
    for key, side in ICON_SIDES.items():
        file = app.get("icons", {}).get(key)
        header = png_header(icons.get(key, b""))
        if header is None:
            yield f"icons.{key} ({file}) is missing or not a PNG"
            continue
        width, height, colour_type = header
        if (width, height) != (side, side):
            yield f"icons.{key} ({file}) is {width}x{height}; Teams wants {side}x{side}"
        if key == "outline" and colour_type not in _PNG_ALPHA_TYPES:
            yield f"icons.outline ({file}) has no alpha channel; Teams wants white on transparent"


def problems(app: Mapping[str, Any], icons: Mapping[str, bytes], host: str) -> list[str]:
    """Everything Teams would refuse, or that would leave the bot deaf to follow-ups; empty when the package is good."""
    return [
        *_field_problems(app),
        *_bot_problems(app),
        *_domain_problems(app, host),
        *icon_problems(app, icons),
    ]


def package(details: AppDetails, template_dir: Path = TEMPLATE_DIR) -> bytes:
    """The zip's bytes: manifest.json and the two icons at its root."""
    template = json.loads((template_dir / "manifest.json").read_text(encoding="utf-8"))
    app = manifest(template, details)
    files = {key: app.get("icons", {}).get(key, "") for key in ICON_SIDES}
    icons = {key: (template_dir / name).read_bytes() for key, name in files.items() if (template_dir / name).is_file()}
    found = problems(app, icons, details.host)
    if found:
        raise PackageError(found)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        entries = {"manifest.json": (json.dumps(app, indent=2, ensure_ascii=False) + "\n").encode()}
        entries |= {files[key]: data for key, data in icons.items()}
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser("teams-package", help="write the Teams app package (manifest.json and icons, zipped)")
    command.add_argument("--app-id", help=f"the app registration's client id (default: {APP_ID_VARIABLE})")
    command.add_argument("--host", help="the public host name where the bot serves /api/messages")
    command.add_argument("--name", help="the app's name in Teams (default: the declaration's brand.teams_app_name)")
    command.add_argument("--developer", help="the publisher's name (default: the app's name)")
    command.add_argument("--website", help="the publisher's https:// page (default: https://HOST/)")
    command.add_argument("--privacy-url", help="the privacy policy's https:// URL (default: the website)")
    command.add_argument("--terms-url", help="the terms of use' https:// URL (default: the website)")
    command.add_argument("--version", help="the app's version, higher than the uploaded one for an update (1.0.0)")
    command.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the zip to write (default: {DEFAULT_OUT})")


def _declared_name() -> str:
    """The name the operator's declaration gives the app, found as the bot finds it (HELPDESK_FILE, ./helpdesk.yaml,
    else the sample's)."""
    from pydantic import ValidationError

    from bot.declaration.build import find, teams_app_name
    from bot.declaration.parse import load
    from bot.settings import Settings

    try:
        settings = Settings()
    except ValidationError:  # settings this command does not need are half set: only the declaration's path counts
        chosen = os.environ.get("HELPDESK_FILE")
        settings = Settings.model_construct(helpdesk_file=Path(chosen) if chosen else None)
    return teams_app_name(load(find(settings)))


def run(args: argparse.Namespace) -> int:
    try:
        details = app_details(
            app_id=args.app_id or _SdkVariables().app_id,
            host=args.host,
            name=args.name or _declared_name(),
            developer=args.developer,
            website_url=args.website,
            privacy_url=args.privacy_url,
            terms_url=args.terms_url,
            version=args.version,
        )
        data = package(details)
    except PackageError as exc:
        print("No Teams app package was written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    try:
        args.out.write_bytes(data)
    except OSError as exc:
        print(f"No Teams app package was written: {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"Wrote {args.out}: app id {details.app_id}, messaging endpoint https://{details.host}/api/messages.")
    print("Upload it in Teams (Apps > Manage your apps > Upload an app) or the Teams admin center.")
    return 0
