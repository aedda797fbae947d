"""The outbox's deliveries: a closed set of typed values that round-trip through their `outbox` rows, one sender
that posts them, and escalation that renders without posting."""

from __future__ import annotations

import ast
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db import deliveries as d
from agents.db import models as m
from agents.db.deliveries import KINDS, Delivery, Outcome, delivery_of, enqueue, row_of
from bot.channels.capabilities import Channels
from bot.delivery.sender import OutboxSender
from bot.playground.slack_emulator import SlackEmulator
from bot.slack.app import slack_client
from bot.slack.channel import SLACK
from bot.slack.messenger import SlackMessenger
from harness.slack_calls import calls
from tests import ROOT

Sessions = async_sessionmaker[AsyncSession]


def examples(conversation_id: int = 1, escalation_id: int = 1) -> list[Delivery]:
    """One of each kind, every field set to a value no other field has."""
    c, e = conversation_id, escalation_id
    return [
        d.Post(c, "C_SUPPORT", "1.000001", "hello"),
        d.Post(c, "D_DIRECT", None, "a direct message"),
        d.Answer(c, "C_SUPPORT", "1.000009", "**an** answer"),
        d.AddReaction(c, "C_SUPPORT", "1.000002", "eyes"),
        d.RemoveReaction(c, "C_SUPPORT", "1.000003", "white_check_mark"),
        d.Typing(c, "19:chat@thread.tacv2", "1700000000005"),
        d.CasePost(c, e, "C_STAFF"),
        d.CaseUpdate(c, e),
        d.RelayToStaff(c, e, "U_CUSTOMER", "hello? anyone?"),
        d.RelayToCustomer(c, e, "C_SUPPORT", "1.000004", "U_STAFF", "Sam here.", "2.000001"),
        d.RelayEdit(c, e, "2.000002", "Sam here, edited."),
        d.RelayDelete(c, e, "2.000003"),
        d.Reminder(c, e, "Case #1 has waited 16 min"),
        d.StaffNotice(c, e, "U_GUEST", "Only the support team can reply."),
        d.CsatAsk(c, e, "C_SUPPORT", "1.000005", "How did we do?"),
        d.FilesToStaff(c, e, "U_CUSTOMER", "my receipt", "1.000015"),
        d.FilesToCustomer(c, e, "C_SUPPORT", "1.000016", "U_STAFF", "2.000004"),
        d.Erase(c, 7),
        d.Erase(c, None, "C_SUPPORT", "1.000017", "1.000018"),
    ]


def test_every_delivery_kind_round_trips_through_its_row() -> None:
    owed = examples()
    assert {type(d) for d in owed} == set(KINDS.values())  # an example of every kind, so a new one is tested too
    assert len(KINDS) == len({cls.kind for cls in KINDS.values()})
    for delivery in owed:
        row = row_of(delivery)
        assert row["kind"] == delivery.kind and delivery_of(row) == delivery
        assert set(row) <= {c.name for c in m.Outbox.__table__.columns}
    with pytest.raises(ValueError, match="unknown outbox kind 'carrier_pigeon'"):
        delivery_of(row_of(owed[0]) | {"kind": "carrier_pigeon"})


async def test_deliveries_round_trip_through_the_outbox_table(sessions: Sessions, engine: AsyncEngine) -> None:
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1.000001", active_agent="triage")
        s.add(conversation)
        await s.flush()
        escalation = m.Escalation(conversation_id=conversation.id, reason="r", trigger="tool", agent="triage")
        s.add(escalation)
        await s.flush()
        owed = examples(conversation.id, escalation.id)
        await enqueue(s, owed)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(m.Outbox).order_by(m.Outbox.id))).all()
    assert [delivery_of(r._mapping) for r in rows] == owed


async def test_a_row_of_an_unknown_kind_is_given_up_not_retried(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1.000001", active_agent="triage")
        s.add(conversation)
        await s.flush()
        s.add(m.Outbox(conversation_id=conversation.id, kind="carrier_pigeon", channel="C_SUPPORT"))
        await enqueue(s, [d.Post(conversation.id, "C_SUPPORT", None, "after the pigeon")])
    client = slack_client(token="xoxb-test", base_url=emulator.api_url, idempotent_only=True)
    assert (
        await OutboxSender(
            engine=engine, channels=Channels([SLACK]), messengers=[SlackMessenger(client)]
        ).send_pending()
        == 1
    )  # the pigeon is given up, not sent
    async with sessions() as s:
        pigeon, post = (await s.scalars(select(m.Outbox).order_by(m.Outbox.id))).all()
    assert pigeon.outcome == Outcome.GIVEN_UP and pigeon.last_error == "unknown outbox kind 'carrier_pigeon'"
    assert post.result_ts is not None and [p.text for p in emulator.posts("C_SUPPORT")] == ["after the pigeon"]


def _imports(path: Any) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_escalation_renders_and_never_imports_the_bot_or_a_slack_client() -> None:
    for path in sorted((ROOT / "escalation").rglob("*.py")):
        forbidden = {i for i in _imports(path) if i.split(".")[0] in ("bot", "slack_sdk", "slack_bolt")}
        assert not forbidden, f"{path.relative_to(ROOT)} imports {forbidden}"


def test_only_the_sender_posts_edits_deletes_or_reacts() -> None:
    """Through its Slack messenger, which makes the calls the sender decides on (and nothing else makes them)."""
    changing = {"chat.postMessage", "chat.update", "chat.delete", "reactions.add", "reactions.remove"}
    callers = {call.where.split(":")[0] for call in calls() if call.method in changing}
    assert callers == {"bot/slack/messenger.py"}
