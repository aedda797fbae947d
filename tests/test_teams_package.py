"""`python -m bot teams-package` as an admin runs it: a real subprocess in an empty folder, the zip it writes read
back, and the refusals for inputs Teams would not take."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bot.admin.parse import USAGE
from bot.teams.package import TEMPLATE_DIR, PackageError, app_details, package
from harness.bot import clean_environ
from tests import ROOT

APP_ID = "3f1c2b7a-9d4e-4c5b-8a6f-0e1d2c3b4a59"
SDK_APP_ID = "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID"


def run_package(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # No SDK variable leaks in from the developer's shell: only what a test gives.
    environ = {k: v for k, v in clean_environ().items() if not k.startswith("CONNECTIONS__")} | (env or {})
    command = [sys.executable, "-m", "bot", "teams-package", *args]
    return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)


def png_size(data: bytes) -> tuple[int, int, int]:
    """Width, height and colour type, read from the IHDR chunk as Teams does."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height, _depth, colour_type = struct.unpack(">IIBB", data[16:26])
    return width, height, colour_type


def read_zip(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    return json.loads(files.pop("manifest.json")), files


@pytest.mark.services
def test_the_package_holds_a_manifest_for_this_bot_and_its_icons(tmp_path: Path) -> None:
    args = ["--app-id", APP_ID, "--host", "helpdesk.example.com", "--name", "Acme Help", "--version", "1.2.3"]
    done = run_package(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "https://helpdesk.example.com/api/messages" in done.stdout

    manifest, icons = read_zip(tmp_path / "teams-app.zip")
    assert set(icons) == {"color.png", "outline.png"}  # with manifest.json, all at the zip's root
    assert manifest["id"] == APP_ID and manifest["name"]["short"] == "Acme Help" and manifest["version"] == "1.2.3"
    assert manifest["manifestVersion"] == manifest["$schema"].split("/v")[-1].split("/")[0]
    [bot] = manifest["bots"]
    assert bot["botId"] == APP_ID
    assert set(bot["scopes"]) == {"personal", "team", "groupChat"} and bot["supportsFiles"] is False
    # The admin commands, suggested where admins type them, are /support's own.
    [commands] = bot["commandLists"]
    assert commands["scopes"] == ["personal"]
    titles = [c["title"] for c in commands["commands"]]
    assert titles == [
        "help",
        "status",
        "conversations",
        "show",
        "escalations",
        "pause",
        "resume",
        "kb",
        "stats",
        "tools",
    ]
    assert all(c["description"] == USAGE[c["title"]][1] for c in commands["commands"])
    # Every message of a reply chain or group chat reaches the bot, not only those that mention it.
    rsc = manifest["authorization"]["permissions"]["resourceSpecific"]
    assert {(p["name"], p["type"]) for p in rsc} == {
        ("ChannelMessage.Read.Group", "Application"),
        ("ChatMessage.Read.Chat", "Application"),
    }
    assert manifest["webApplicationInfo"]["id"] == APP_ID
    assert manifest["validDomains"] == ["helpdesk.example.com"]
    assert "{{" not in json.dumps(manifest)

    assert png_size(icons[manifest["icons"]["color"]])[:2] == (192, 192)
    width, height, colour_type = png_size(icons[manifest["icons"]["outline"]])
    assert (width, height) == (32, 32) and colour_type == 6  # RGBA: white on transparent


@pytest.mark.services
def test_the_app_id_comes_from_the_sdk_variable_in_dotenv_or_the_environment(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"{SDK_APP_ID}={APP_ID.upper()}\n")
    done = run_package("--host", "https://helpdesk.example.com/", "--out", "app.zip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest, _ = read_zip(tmp_path / "app.zip")
    assert manifest["id"] == manifest["bots"][0]["botId"] == APP_ID  # Azure shows it lower-case
    assert manifest["validDomains"] == ["helpdesk.example.com"]

    other = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    done = run_package("--host", "helpdesk.example.com", cwd=tmp_path, env={SDK_APP_ID: other})
    assert done.returncode == 0, done.stderr
    assert read_zip(tmp_path / "teams-app.zip")[0]["id"] == other  # the environment wins over .env


@pytest.mark.services
@pytest.mark.parametrize(
    ("args", "reasons"),
    [
        (["--app-id", "not-a-guid", "--host", "helpdesk.example.com"], ["app id 'not-a-guid' is not a GUID"]),
        (["--host", "helpdesk.example.com"], ["no app id", SDK_APP_ID]),
        (["--app-id", APP_ID], ["no host: pass --host"]),
        (["--app-id", APP_ID, "--host", "http://helpdesk.example.com/api"], ["is not a public host name"]),
        (["--app-id", APP_ID, "--host", "h.example.com", "--name", "x" * 31], ["name.short has 31 characters"]),
        (["--app-id", APP_ID, "--host", "h.example.com", "--website", "http://a.example.com"], ["websiteUrl"]),
        (["--app-id", APP_ID, "--host", "h.example.com", "--version", "2"], ["version '2' is not MAJOR.MINOR.PATCH"]),
    ],
    ids=["bad-guid", "no-app-id", "no-host", "http-host-with-path", "long-name", "http-website", "bad-version"],
)
def test_invalid_or_missing_input_writes_nothing_and_says_why(
    tmp_path: Path, args: list[str], reasons: list[str]
) -> None:
    done = run_package(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "No Teams app package was written" in done.stderr
    for reason in reasons:
        assert reason in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "teams-app.zip").exists()


def test_an_edited_template_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    template = shutil.copytree(TEMPLATE_DIR, tmp_path / "teams")
    shutil.copy(template / "color.png", template / "outline.png")
    app = json.loads((template / "manifest.json").read_text())
    app["description"]["short"] += " Write to {{SUPPORT_EMAIL}}."
    app["authorization"]["permissions"]["resourceSpecific"].pop(0)
    (template / "manifest.json").write_text(json.dumps(app))

    with pytest.raises(PackageError) as refused:
        package(app_details(app_id=APP_ID, host="helpdesk.example.com"), template)
    found = "\n".join(refused.value.problems)
    assert "icons.outline (outline.png) is 192x192; Teams wants 32x32" in found
    assert "description.short has 101 characters; Teams takes 1 to 80" in found
    assert "description.short still has a placeholder" in found
    assert "lacks ChannelMessage.Read.Group" in found


def test_the_template_is_shipped_in_the_wheel() -> None:
    """A `pip install .` user runs the command without a checkout: the template and icons travel with `bot`."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "bot.teams.manifest" in setuptools["packages"]
    assert (ROOT / setuptools["package-dir"]["bot.teams.manifest"]).resolve() == TEMPLATE_DIR
    shipped = setuptools["package-data"]["bot.teams.manifest"]
    icons = json.loads((TEMPLATE_DIR / "manifest.json").read_text())["icons"].values()
    for name in ["manifest.json", *icons]:
        assert any(Path(name).match(pattern) for pattern in shipped), name
