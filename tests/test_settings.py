from __future__ import annotations

from pathlib import Path

import pytest

from bot.settings import Settings
from tests import ROOT as PROJECT_ROOT


def test_blank_values_mean_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    (tmp_path / ".env").write_text((PROJECT_ROOT / ".env.example").read_text())
    settings = Settings()
    assert settings.database_url is None
    assert settings.openai_api_key is None and not settings.llm_configured
    assert settings.data_dir == Path(".data")
    assert settings.openai_model == "gpt-4o-mini"


def test_env_example_lists_every_setting() -> None:
    example = (PROJECT_ROOT / ".env.example").read_text()
    for name in Settings.model_fields:
        assert f"\n{name.upper()}=" in example, name


def test_admin_ids_and_provider(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADMIN_USER_IDS", "U1, U2,,")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    settings = Settings()
    assert settings.admin_ids == frozenset({"U1", "U2"})
    assert settings.llm_configured
