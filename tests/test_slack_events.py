"""The typed edge: which Events API payloads become customer messages."""

from __future__ import annotations

from typing import Any

import pytest

from agents.address import Address, Platform
from bot.channels.incoming import CustomerMessage, Ignored
from bot.slack.events import Policy, classify

POLICY = Policy(bot_user_id="UBOT", staff_channel="C_STAFF")


def envelope(**event: Any) -> dict[str, Any]:
    base = {"type": "message", "channel": "C1", "user": "U1", "text": "hello", "ts": "100.000001"}
    return {"type": "event_callback", "team_id": "T1", "event": base | event}


def test_top_level_message_starts_a_conversation_keyed_on_team_channel_ts() -> None:
    message = classify(envelope(), POLICY)
    assert message == CustomerMessage(
        "T1", "C1", "100.000001", "100.000001", "U1", "hello", False, "T1", Platform.SLACK
    )
    assert Address.parse(message.conversation_key) == Address("slack", "T1", "C1", "100.000001") == message.address


def test_thread_reply_joins_its_thread() -> None:
    message = classify(envelope(ts="101.0", thread_ts="100.000001"), POLICY)
    assert isinstance(message, CustomerMessage) and message.thread_ts == "100.000001"


@pytest.mark.parametrize(
    "event",
    [
        {"bot_id": "B2", "user": "U2"},
        {"user": "UBOT"},
        {"subtype": "message_changed"},
        {"subtype": "message_deleted"},
        {"subtype": "channel_join"},
        {"subtype": "bot_message", "bot_id": "B2"},
        {"hidden": True},
        {"channel": "C_STAFF"},
        {"text": "   "},
        {"type": "reaction_added"},
    ],
)
def test_ignored(event: dict[str, Any]) -> None:
    assert isinstance(classify(envelope(**event), POLICY), Ignored)


def test_other_bots_answered_when_configured() -> None:
    policy = Policy("UBOT", "C_STAFF", answer_bots=True)
    assert isinstance(classify(envelope(bot_id="B2", user="U2"), policy), CustomerMessage)
    assert isinstance(classify(envelope(bot_id="BBOT", user="UBOT"), policy), Ignored)


def test_file_share_delivers_its_text_and_mention_is_stripped() -> None:
    message = classify(envelope(subtype="file_share", text="<@UBOT> photo of the crash", files=[{}]), POLICY)
    assert isinstance(message, CustomerMessage) and message.text == "photo of the crash"


def test_served_channels_and_dms() -> None:
    policy = Policy("UBOT", "C_STAFF", channels=frozenset({"C9"}))
    assert isinstance(classify(envelope(), policy), Ignored)
    dm = classify(envelope(channel="D1", channel_type="im"), policy)
    assert isinstance(dm, CustomerMessage) and dm.is_dm
    # A DM is one conversation per thread, as the agent messaging experience shows it: answered in its thread.
    assert Address.parse(dm.conversation_key) == Address("slack", "T1", "D1", dm.ts) == dm.address
    reply = classify(envelope(channel="D1", channel_type="im", ts="200.000002", thread_ts=dm.ts), policy)
    assert isinstance(reply, CustomerMessage) and reply.conversation_key == dm.conversation_key
    assert Address.parse("cli:ada") is None
