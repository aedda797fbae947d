"""NAME_FILE: a secret setting read from a file (container and Kubernetes secrets), with clear start-up errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.cli import main
from bot.settings import Settings, env_name, get_settings, secret_settings

TEAMS = {
    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTID": "5f0c8c2e-7b1d-4c1e-9a57-3c2d1e0f4a6b",
    "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__TENANTID": "8e1f4c3a-2b6d-4e9f-8a7c-1d2e3f4a5b6c",
}


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """No setting from the test's own environment, and no `.env` but the test's."""
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        for variable in {name.upper(), env_name(name)}:
            monkeypatch.delenv(variable, raising=False)
            monkeypatch.delenv(f"{variable}_FILE", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_the_secrets_are_the_ones_an_operator_expects() -> None:
    assert secret_settings() >= {
        "database_url",
        "database_listen_url",
        "openai_api_key",
        "embeddings_api_key",
        "slack_bot_token",
        "slack_signing_secret",
        "slack_app_token",
        "metrics_token",
        "teams_app_password",
    }


@pytest.mark.parametrize("name", sorted(secret_settings()))
def test_every_secret_reads_its_file(name: str, clean: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One trailing newline is what `echo` and most editors leave: it goes; anything else is the secret's."""
    secret = tmp_path / "secret"
    secret.write_text("postgresql://u:p@db/x \n\n" if name.startswith("database") else "s3cret \n\n")
    if name == "teams_app_password":
        for variable, value in TEAMS.items():
            clean.setenv(variable, value)
    clean.setenv(f"{env_name(name)}_FILE", str(secret))
    value = getattr(Settings(), name)
    expected = "postgresql://u:p@db/x \n" if name.startswith("database") else "s3cret \n"
    assert (value.get_secret_value() if isinstance(value, SecretStr) else value) == expected


def test_the_file_may_be_named_in_dotenv_and_under_the_settings_own_name(
    clean: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("xoxb-from-a-file\r\n")
    (tmp_path / "password").write_text("from-a-file")
    (tmp_path / ".env").write_text(f"SLACK_BOT_TOKEN_FILE={tmp_path / 'token'}\n")
    for variable, value in TEAMS.items():
        clean.setenv(variable, value)
    clean.setenv("TEAMS_APP_PASSWORD_FILE", str(tmp_path / "password"))
    settings = Settings()
    assert settings.slack_bot_token is not None and settings.slack_bot_token.get_secret_value() == "xoxb-from-a-file"
    assert settings.teams_app_password is not None and settings.teams_app_password.get_secret_value() == "from-a-file"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"OPENAI_API_KEY": "sk-1", "OPENAI_API_KEY_FILE": "{dir}/key"},
            "OPENAI_API_KEY: Value error, OPENAI_API_KEY and OPENAI_API_KEY_FILE are both set: keep one",
        ),
        ({"METRICS_TOKEN_FILE": "{dir}/absent"}, "METRICS_TOKEN_FILE={dir}/absent: no such file"),
        ({"METRICS_TOKEN_FILE": "{dir}"}, "METRICS_TOKEN_FILE={dir}: cannot be read (Is a directory)"),
        ({"SLACK_SIGNING_SECRET_FILE": "{dir}/empty"}, "SLACK_SIGNING_SECRET_FILE={dir}/empty: the file is empty"),
        ({"DATABASE_URL_FILE": "{dir}/latin1"}, "DATABASE_URL_FILE={dir}/latin1: not UTF-8 text"),
    ],
)
def test_a_file_that_cannot_be_used_stops_the_start_naming_the_variable(
    env: dict[str, str], says: str, clean: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "key").write_text("sk-2\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "latin1").write_bytes("postgresql://u:pä@db/x".encode("latin-1"))
    for variable, value in env.items():
        clean.setenv(variable, value.format(dir=tmp_path))
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert "The configuration has errors; nothing was started:" in err
    assert says.format(dir=tmp_path) in err
