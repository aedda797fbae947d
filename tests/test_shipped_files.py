"""The manifest and Procfile match what the code serves."""

from __future__ import annotations

import yaml

from tests import ROOT as PROJECT_ROOT


def test_manifest_points_everything_at_the_one_endpoint() -> None:
    manifest = yaml.safe_load((PROJECT_ROOT / "manifest.yml").read_text())
    settings = manifest["settings"]
    assert settings["event_subscriptions"]["request_url"].endswith("/slack/events")
    assert settings["interactivity"]["request_url"].endswith("/slack/events")
    assert manifest["features"]["slash_commands"][0]["url"].endswith("/slack/events")
    assert {"message.channels", "message.im", "app_mention"} <= set(settings["event_subscriptions"]["bot_events"])
    assert {"chat:write", "reactions:write", "users:read"} <= set(manifest["oauth_config"]["scopes"]["bot"])
