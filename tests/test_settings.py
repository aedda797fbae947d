from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.cli import main
from bot.declaration.parse import TEXTS
from bot.settings import GROUPS, Settings, TextsSettings, env_name, get_settings
from tests import ROOT as PROJECT_ROOT


def test_blank_values_mean_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    (tmp_path / ".env").write_text((PROJECT_ROOT / ".env.example").read_text())
    settings = Settings()
    assert settings.database_url is None
    assert settings.openai_api_key is None and not settings.llm_configured
    assert settings.data_dir == Path(".data")
    assert settings.openai_model == "gpt-4o-mini"


def test_env_example_lists_every_setting() -> None:
    """Every setting, set or (the texts, which belong in the declaration) commented out with its default."""
    example = (PROJECT_ROOT / ".env.example").read_text()
    for name in Settings.model_fields:
        assert f"\n{env_name(name)}=" in example or f"\n# {env_name(name)}=" in example, name


def test_configuration_reference_is_generated_from_every_setting() -> None:
    """docs/configuration.md's reference is generated from the groups (scripts/mkdocs_hooks.py): every setting in one
    table, under the variable it is documented by, with its default and a description."""
    from scripts.mkdocs_hooks import SETTINGS, settings_reference

    assert SETTINGS in (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    reference = settings_reference()
    rows = [row for row in reference.splitlines() if row.startswith("| `")]
    documented = [row.split("`")[1] for row in rows]
    assert sorted(documented) == sorted(env_name(name) for name in Settings.model_fields)
    for row in rows:
        assert all(cell.strip() for cell in row.strip("|").split(" | ")), row
    assert [line.removeprefix("### ") for line in reference.splitlines() if line.startswith("### ")] == [
        (group.__doc__ or "").partition(":")[0] for group in GROUPS
    ]


def test_the_groups_make_the_settings() -> None:
    """Each setting in one group, and the customer-facing texts a declaration may set are the texts group."""
    names = [name for group in GROUPS for name in group.model_fields]
    assert sorted(names) == sorted(Settings.model_fields)
    assert set(TEXTS) == set(TextsSettings.model_fields)


def test_admin_ids_and_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADMIN_USER_IDS", "U1, U2,,")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    settings = Settings()
    assert settings.admin_ids == frozenset({"U1", "U2"})
    assert settings.llm_configured


def test_templates_are_checked_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template that cannot be filled would fail every message it is used on (the give-up path included):
    the bot refuses to start instead and says which variable, and why."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OFF_HOURS_MESSAGE", "We are back {hourz}.")
    monkeypatch.setenv("HANDOFF_NOTICE", "Connecting you with {agent")
    with pytest.raises(ValidationError):
        Settings()
    get_settings.cache_clear()
    try:
        assert main(["serve"]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "OFF_HOURS_MESSAGE: Value error, unknown placeholder {hourz}; it may use {hours}" in err
    assert "HANDOFF_NOTICE: Value error, not a valid template" in err
    monkeypatch.setenv("OFF_HOURS_MESSAGE", "Back {hours}; {{braces}} stay.")
    monkeypatch.delenv("HANDOFF_NOTICE")
    assert str(Settings().off_hours_message).format(hours="9-17") == "Back 9-17; {braces} stay."


TEAMS = {
    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID": "5f0c8c2e-7b1d-4c1e-9a57-3c2d1e0f4a6b",
    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET": "secret",
    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID": "8e1f4c3a-2b6d-4e9f-8a7c-1d2e3f4a5b6c",
}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {
                "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID": TEAMS[
                    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID"
                ]
            },
            "half configured",
        ),
        (TEAMS | {"CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID": "contoso.com"}, "must be a GUID"),
        (TEAMS | {"STAFF_CHANNEL_ID": "C_STAFF", "TEAMS_STAFF_CHANNEL_ID": "19:a@thread.tacv2"}, "not both"),
        ({"TEAMS_STAFF_CHANNEL_ID": "19:a@thread.tacv2"}, "Teams is not configured"),
        (TEAMS | {"TEAMS_STAFF_CHANNEL_ID": "19%3aa%40thread.tacv2"}, "19:abc"),
    ],
)
def test_teams_settings_are_checked_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str], says: str
) -> None:
    """Under the SDK's own variable names; a half-configured Teams stops the bot with the variable to set."""
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    assert main(["migrate"]) == 2
    assert says in capsys.readouterr().err
    get_settings.cache_clear()


def test_teams_settings_read_the_sdks_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in TEAMS.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.teams_configured and settings.teams_app_id == TEAMS[next(iter(TEAMS))]
    assert settings.staff_platform == "slack"


@pytest.mark.parametrize(
    ("url", "local"),
    [
        (None, False),
        ("https://api.openai.com/v1", False),
        ("https://my-resource.openai.azure.com/openai/v1/", False),
        ("http://127.0.0.1:11434/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://ollama:11434/v1", True),  # a compose service
        ("http://10.0.3.7:8000/v1", True),
        ("http://[::1]:1234/v1", True),
        ("http://gpu-box.internal:8000/v1", True),
        ("http://8.8.8.8/v1", False),
        ("http://100.101.102.103:11434/v1", True),  # a Tailscale address
        ("http://[::1:8000/v1", False),  # malformed: no traceback here, the client reports it
    ],
)
def test_a_provider_on_this_machine_or_network_is_local(url: str | None, local: bool) -> None:
    assert Settings(_env_file=None, openai_base_url=url).provider_is_local is local  # type: ignore[call-arg]


async def test_slow_local_models_get_long_timeouts_and_the_client_uses_what_is_set() -> None:
    from bot.runtime.startup import chat_model

    hosted = Settings(_env_file=None, openai_api_key="k")  # type: ignore[call-arg]
    local = Settings(_env_file=None, openai_base_url="http://127.0.0.1:11434/v1")  # type: ignore[call-arg]
    assert (hosted.llm_timeout_s, hosted.llm_max_retries) == (60.0, 2)
    assert (local.llm_timeout_s, local.llm_max_retries) == (600.0, 1)
    chosen = Settings(  # type: ignore[call-arg]
        _env_file=None, openai_base_url="http://127.0.0.1:11434/v1", openai_timeout_s=42, openai_max_retries=0
    )
    for settings, timeout, retries in ((local, 600.0, 1), (chosen, 42.0, 0)):
        client = chat_model(settings).client
        assert (client.timeout, client.max_retries) == (timeout, retries)
        await client.close()
